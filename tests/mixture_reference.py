"""Simple references for the mixture tests: Python integers, one block at a time, no kernels.

``stable_rows`` recomputes a stable mixture from its definition (counts per block, ids source
after source, a keyed permutation per block, reads numbered in row order) and ``least_consumed``
runs the token-balanced rule with a heap, as the seed's ``build_interleaved_dataset`` would.
"""

from __future__ import annotations

import asyncio
import heapq
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
from reference import fmix32, strong_order

from meshbatch.kernels import Counts

MASK32 = 0xFFFFFFFF


def counts_per_block(names, weights, block_size, compat):
    """Rows of each source per block, from the definition (not from meshbatch.datasets.mixtures)."""
    if compat == "levanter":
        total = sum(weights.values())
        counts = [int(weights[n] / total * block_size) for n in names]
        counts[int(np.argmax(counts))] += block_size - sum(counts)
        return counts
    total = sum(Fraction(w) for w in weights.values())
    shares = [Fraction(weights[n]) / total * block_size for n in names]
    counts = [int(s) for s in shares]
    for i in sorted(range(len(names)), key=lambda i: (counts[i] - shares[i], i))[: block_size - sum(counts)]:
        counts[i] += 1
    return counts


def block_permutation(key, block: int, block_size: int, compat) -> np.ndarray:
    """The id at each position of ``block``."""
    if compat == "levanter":
        return np.asarray(jax.random.permutation(jax.random.fold_in(key, block), block_size))
    # the default: the strong Feistel network, round keys a keyed hash of (block, round)
    w0, w1 = (int(w) for w in np.asarray(jax.random.key_data(key)))
    round_keys = [fmix32(((fmix32(block ^ w0) + r * 0x9E3779B9) & MASK32) ^ w1) for r in range(5)]
    return np.asarray(strong_order(block_size, round_keys, 16, range(block_size)))


def stable_rows(lengths, stages, block_size, key, rows, compat=None):
    """``(source, index, source_epoch)`` of each row (Python ints; any size)."""
    names = list(lengths)
    if isinstance(stages, dict):
        stages = [(0, stages)]
    counts = [counts_per_block(names, w, block_size, compat) for _, w in stages]
    starts = [s // block_size for s, _ in stages]
    before = [[0] * len(names)]
    for i in range(1, len(stages)):
        before.append(
            [b + c * (starts[i] - starts[i - 1]) for b, c in zip(before[-1], counts[i - 1], strict=True)]
        )
    cache = {}
    out = []
    for row in rows:
        block, position = divmod(int(row), block_size)
        stage = max(i for i, s in enumerate(starts) if s <= block)
        if block not in cache:
            cache[block] = block_permutation(key, block, block_size, compat)
        ident = int(cache[block][position])
        first = np.cumsum([0, *counts[stage]])
        source = int(np.searchsorted(first, ident, side="right") - 1)
        read = (
            before[stage][source]
            + (block - starts[stage]) * counts[stage][source]
            + ident
            - int(first[source])
        )
        wrap, index = divmod(read, lengths[names[source]])
        out.append((source, index, wrap))
    return out


def levanter_rows(lengths, weights, block_size, seed, rows):
    """``(source, index)`` of each row from Levanter's own ``MixtureDataset.get_batch``."""
    from levanter.data import ListAsyncDataset
    from levanter.data.mixture import MixtureDataset

    datasets = {
        n: ListAsyncDataset([(n, i) for i in range(length)], is_complete=True)
        for n, length in lengths.items()
    }
    mixture = MixtureDataset(datasets, weights, block_size, key=seed)
    names = list(lengths)

    async def run():
        return await mixture.get_batch([int(r) for r in rows])

    return [(names.index(n), i) for n, i in asyncio.run(run())]


def salts(seed: int, sources: int) -> list[int]:
    return [fmix32((seed + s * 0x9E3779B9) & MASK32) for s in range(sources)]


def tie_hash(salt: int, count: int) -> int:
    return fmix32((count & MASK32) ^ salt)


def least_consumed(counts, row_tokens, salt_list):
    """Heap-based least-consumed: each row's ``(source, nth)`` and the final counts."""
    heap = [(c, tie_hash(salt_list[s], c), s) for s, c in enumerate(counts)]
    heapq.heapify(heap)
    taken = [0] * len(counts)
    out = []
    for _ in range(len(row_tokens[0])):
        count, _, s = heapq.heappop(heap)
        tokens = int(row_tokens[s][taken[s]])
        out.append((s, taken[s]))
        taken[s] += 1
        heapq.heappush(heap, (count + tokens, tie_hash(salt_list[s], count + tokens), s))
    final = [0] * len(counts)
    for count, _, s in heap:
        final[s] = count
    return out, final


def counts_of(values) -> Counts:
    """Python-int counts as the kernels' two-word ``Counts``."""
    return Counts(
        jnp.asarray([v >> 32 for v in values], jnp.uint32),
        jnp.asarray([v & 0xFFFFFFFF for v in values], jnp.uint32),
    )


def as_ints(counts: Counts) -> list[int]:
    """The kernels' two-word ``Counts`` as Python ints."""
    hi, lo = np.asarray(counts.hi), np.asarray(counts.lo)
    return [(int(h) << 32) + int(w) for h, w in zip(hi, lo, strict=True)]
