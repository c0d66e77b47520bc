"""Where every document goes: the packing plan around the jitted kernel, and the shuffle levels.

``plan_layout(lengths, spec, key)`` decides the whole preblocked stream from document lengths
alone; the writer and the legacy dataset both use it, so a store and a cache packed on the fly
hold the same blocks. The shuffle levels:

    none      documents in source order, packed, blocks in packed order
    document  documents in the order of a keyed permutation (``fold_in(key, 0)``), then packed;
              a document split over blocks stays in consecutive blocks (the default)
    segment   documents packed in source order, then the blocks permuted (``fold_in(key, 1)``);
              the pieces of a long document end up far apart

The permutations are numpy's PCG64 ``permutation`` seeded with the folded key's data: a one-time
host table, the same on every machine.

    lengths [1, 4, 2, 9], block_size 8, ffd, none:
    starts (flat slot of each [DOC]) = [24, 16, 11, 0]; blocks 4; real tokens per block [8, 7, 6, 3]
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from meshbatch.arguments import as_key, check_choice, check_int
from meshbatch.kernels import pack_plan
from meshbatch.kernels.internal import MARKERS, PACKING_RULES, PackingRule

logger = logging.getLogger(__name__)

ShuffleLevel = Literal["none", "document", "segment"]
SHUFFLE_LEVELS: tuple[str, ...] = ("none", "document", "segment")
INT32_LIMIT = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class PackSpec:
    """How documents become blocks.

    Attributes:
        block_size: slots per block, ``2 <= block_size <= 2**24``.
        shuffle_level: ``"none"``, ``"document"`` or ``"segment"`` (see the module docstring).
        rule: ``"ffd"`` (buffered first-fit decreasing) or ``"greedy"`` (plain next-fit).
        buffer_docs: documents grouped per buffer with ``"ffd"``.
    """

    block_size: int
    shuffle_level: ShuffleLevel = "document"
    rule: PackingRule = "ffd"
    buffer_docs: int = 1024

    def __post_init__(self):
        check_int("block_size", self.block_size, low=2, high=2**24)
        check_choice("shuffle_level", self.shuffle_level, SHUFFLE_LEVELS)
        check_choice("rule", self.rule, PACKING_RULES)
        check_int("buffer_docs", self.buffer_docs, low=1, high=(2**31 - 1) // (self.block_size + 2))


@dataclasses.dataclass(frozen=True)
class Layout:
    """The packed stream.

    Attributes:
        sizes: ``int64[n]`` slots per document (tokens + 2), by document id.
        starts: ``int64[n]`` flat slot of each document's ``[DOC]`` in the packed stream (block
            ``starts // block_size``), by document id.
        block_order: ``int64[num_blocks]``: output block ``p`` holds packed block
            ``block_order[p]`` (the identity except with ``shuffle_level="segment"``).
        greedy_blocks: blocks plain greedy packing of the same order would fill (for the fill
            statistics).
    """

    spec: PackSpec
    sizes: np.ndarray
    starts: np.ndarray
    num_blocks: int
    block_order: np.ndarray
    greedy_blocks: int

    @property
    def num_docs(self) -> int:
        return self.sizes.shape[0]

    @property
    def slots(self) -> int:
        """Non-pad slots (tokens plus markers)."""
        return int(self.sizes.sum())

    def fill(self) -> dict[str, float | int]:
        """Fill statistics: the share of slots that are not padding, this rule and plain greedy."""
        S = self.spec.block_size
        split = int(np.count_nonzero(self.starts // S != (self.starts + self.sizes - 1) // S))
        return {
            "fill": self.slots / (self.num_blocks * S),
            "greedy_fill": self.slots / (self.greedy_blocks * S),
            "content_fill": (self.slots - MARKERS * self.num_docs) / (self.num_blocks * S),
            "pad_slots": self.num_blocks * S - self.slots,
            "split_documents": split,
        }

    def by_position(self) -> np.ndarray:
        """Document ids sorted by where they start in the packed stream (int64)."""
        return np.argsort(self.starts, kind="stable")

    def block_docs(self, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """For every packed block ``b``: ``first[b]``, ``stop[b]``, the range of ``order``
        (``by_position()``) holding the documents with slots in ``b``."""
        order = self.by_position() if order is None else order
        S = self.spec.block_size
        starts = self.starts[order]
        ends = starts + self.sizes[order]
        edges = np.arange(self.num_blocks + 1, dtype=np.int64) * S
        first = np.searchsorted(ends, edges[:-1], side="right")
        stop = np.searchsorted(starts, edges[1:], side="left")
        return first, stop

    def real_tokens(self) -> np.ndarray:
        """``int32[num_blocks]`` non-pad slots of each packed block."""
        order = self.by_position()
        starts, sizes = self.starts[order], self.sizes[order]
        before = np.concatenate([[0], np.cumsum(sizes)])  # slots of the documents before each
        edges = np.arange(self.num_blocks + 1, dtype=np.int64) * self.spec.block_size
        k = np.maximum(np.searchsorted(starts, edges, side="right") - 1, 0)  # last doc starting <= edge
        filled = before[k] + np.clip(edges - starts[k], 0, sizes[k])  # non-pad slots before each edge
        return np.diff(filled).astype(np.int32)


def plan_layout(lengths, spec: PackSpec, key: PRNGKeyArray) -> Layout:
    """The packed stream of documents of ``lengths`` tokens (see the module docstring).

    Args:
        lengths: ``[n]`` integer tokens per document (markers excluded), ``n >= 1``.
        key: a JAX key or an int seed; unused with ``shuffle_level="none"``.

    Raises:
        ValueError: no documents, a negative length, a document or a stream too long for int32
            block arithmetic.
    """
    if not isinstance(spec, PackSpec):
        raise TypeError(f"spec must be a PackSpec (got spec={spec!r})")
    key = as_key(key)
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.shape[0] == 0 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"lengths must be a non-empty 1-D integer array (got shape={lengths.shape})")
    S, n = spec.block_size, lengths.shape[0]
    if n > INT32_LIMIT:
        raise ValueError(f"{n} documents exceed 2**31 - 1")
    if lengths.min() < 0:
        raise ValueError(f"document {int(np.argmin(lengths))} has negative length {int(lengths.min())}")
    longest = int(lengths.max())
    if longest + MARKERS + 2 * S > INT32_LIMIT:
        raise ValueError(f"document {int(np.argmax(lengths))} has {longest} tokens: too long to pack")
    sizes = lengths.astype(np.int64) + MARKERS
    if (int(sizes.sum()) + (n + 1) * S) // S > INT32_LIMIT:
        raise ValueError(f"{int(sizes.sum())} slots in {n} documents need more than 2**31 - 1 blocks")
    order = np.arange(n, dtype=np.int64)
    if spec.shuffle_level == "document" and n > 1:
        order = _permute(n, jax.random.fold_in(key, 0))
    # shapes in powers of two (>= 1024): one compilation serves every corpus size in between
    ordered = np.zeros(max(1024, 1 << (n - 1).bit_length()), np.int32)
    ordered[:n] = lengths[order]
    kw = dict(block_size=S, buffer_docs=spec.buffer_docs)
    placement = pack_plan(jnp.asarray(ordered), jnp.int32(n), rule=spec.rule, **kw)
    greedy = (
        placement
        if spec.rule == "greedy"
        else pack_plan(jnp.asarray(ordered), jnp.int32(n), rule="greedy", **kw)
    )
    num_blocks = int(placement.num_blocks)
    starts = np.empty(n, np.int64)
    block, offset = np.asarray(placement.block)[:n], np.asarray(placement.offset)[:n]
    starts[order] = block.astype(np.int64) * S + offset
    block_order = np.arange(num_blocks, dtype=np.int64)
    if spec.shuffle_level == "segment" and num_blocks > 1:
        block_order = _permute(num_blocks, jax.random.fold_in(key, 1))
    logger.info("packed %d documents into %d blocks of %d (%s)", n, num_blocks, S, spec.rule)
    return Layout(spec, sizes, starts, num_blocks, block_order, int(greedy.num_blocks))


def _permute(n: int, key: PRNGKeyArray) -> np.ndarray:
    """A keyed permutation of ``[0, n)``: numpy's PCG64 seeded with the key's data (a one-time
    host table; no compilation per corpus size)."""
    seed = np.asarray(jax.random.key_data(key), dtype=np.uint32).reshape(-1).tolist()
    return np.random.Generator(np.random.PCG64(seed)).permutation(n).astype(np.int64)


def ramp(counts: np.ndarray) -> np.ndarray:
    """``[0, 1, .., counts[0] - 1, 0, 1, .., counts[1] - 1, ...]``."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


def piece_tokens(slot_start, slots, size) -> tuple[np.ndarray, np.ndarray]:
    """``(first, count)``, int64: the document tokens a piece of a document of ``size`` slots holds,
    when it covers slots ``[slot_start, slot_start + slots)`` (slot 0 is the ``[DOC]``, slot
    ``size - 1`` the ``[EOD]``, slot ``u`` in between token ``u - 1``); an empty piece holds none."""
    first = np.maximum(slot_start - 1, 0).astype(np.int64)
    count = np.maximum(np.minimum(slot_start + slots - 1, size - 2) - first, 0).astype(np.int64)
    return first, count
