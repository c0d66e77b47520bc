"""Independent, deliberately simple references the kernels must equal (pure Python / numpy).

Levanter is imported by the functions that use it, not here: multi-process workers import test
modules that import this one (for their pipeline factories) and would each spend about 5 s on it.
"""

from __future__ import annotations

import asyncio
import functools
import math

import jax
import numpy as np


def levanter_order(kind: str, length: int, key, indices: np.ndarray) -> np.ndarray:
    """Levanter's own ``Permutation.make(kind, length, key)`` applied to ``indices``."""
    from levanter.data._prp import Permutation as LevanterPermutation

    return np.asarray(LevanterPermutation.make(kind, length, key)(np.asarray(indices, np.int64)))


def levanter_era_order(length: int, era_length: int, key, kind: str = "feistel") -> np.ndarray:
    """Levanter's ``EraShufflingDataset`` over ``range(length)``, through its async API."""
    from levanter.data import ListAsyncDataset
    from levanter.data.permutation import EraShufflingDataset

    dataset = ListAsyncDataset(list(range(length)), is_complete=True)
    era = EraShufflingDataset(dataset, era_length, key=key, perm_type=kind)
    return np.asarray(asyncio.run(era.get_batch(list(range(length)))))


def marin_block_order(length: int, io_block_size: int, window_blocks: int, key, kind: str) -> list[int]:
    """marin's ``BlockShufflingDataset._map_index`` transcribed index by index, on Levanter's PRPs."""
    from levanter.data._prp import Permutation as LevanterPermutation

    block_key, full_key, tail_key = jax.random.split(key, 3)
    io, wb = io_block_size, window_blocks
    full_blocks, tail = divmod(length, io)
    total = full_blocks + (tail > 0)
    window_size = io * wb
    windows = -(-total // wb)
    before_last = 0 if windows <= 1 else (windows - 1) * window_size
    block_perm = LevanterPermutation.make(kind, full_blocks, block_key) if full_blocks > 1 else None

    @functools.cache
    def region_perm(region_key_index: int, w: int, size: int):
        region_key = (full_key, tail_key)[region_key_index]
        return LevanterPermutation.make(kind, size, jax.random.fold_in(region_key, w)) if size > 1 else None

    out = []
    for i in range(length):
        if windows == 1:
            w, offset = 0, i
        elif i < before_last:
            w, offset = divmod(i, window_size)
        else:
            w, offset = windows - 1, i - before_last
        start = w * wb
        here = min(wb, total - start)
        has_tail = tail > 0 and start + here == total
        blocks = [
            start + j if block_perm is None else int(block_perm(start + j)) for j in range(here - has_tail)
        ]
        full = len(blocks) * io
        if offset < full:
            perm = region_perm(0, w, full)
            p = offset if perm is None else int(perm(offset))
            out.append(blocks[p // io] * io + p % io)
        else:
            perm = region_perm(1, w, tail)
            t = offset - full
            out.append(full_blocks * io + (t if perm is None else int(perm(t))))
    return out


def fmix32(h: int) -> int:
    """murmur3's finaliser on a Python int (``meshbatch.kernels`` computes it in uint32)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def strong_order(length: int, round_keys: list[int], min_half: int, indices) -> list[int]:
    """The strong default from its definition: mixed-radix Feistel on [0, a*b), cycle-walked."""
    a = max(math.isqrt(length - 1) + 1 if length > 1 else 1, min_half)
    b = max(-(-length // a), min_half)

    def network(x: int) -> int:
        ra, rb = a, b
        for k in round_keys:
            left, right = divmod(x, rb)
            f = ((fmix32(right ^ k) >> 16) * ra) >> 16
            x = right * ra + (left + f) % ra
            ra, rb = rb, ra
        return x

    out = []
    for i in indices:
        if length == 1:
            out.append(0)
            continue
        y = network(int(i))
        while y >= length:
            y = network(y)
        out.append(y)
    return out
