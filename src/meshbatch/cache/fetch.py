"""Fetching coalesced runs: one TensorStore read per run, all in one batch, into one buffer.

The global token space is the concatenation of *segments*, one per data array (one for a
consolidated cache, one per non-empty shard of a sharded cache). A run that crosses a segment
boundary is read as one piece per segment::

    segments: part-0 holds tokens [0, 7), part-1 holds [7, 16)
    run (5, 4) = tokens [5, 9) -> part-0 data[5:7] and part-1 data[0:2]: 2 reads, buffer[0:2], [2:4]

All reads go through one ``ts.Batch`` with ``batch=`` on every read (a bare ``with ts.Batch():``
batches nothing). A run longer than ``max_read_tokens`` is cut at multiples of it: the pieces decode
the same zarr chunks, but TensorStore fills outputs of tens of MiB several times slower than a few
MiB (measured: 8Mi-token reads ~3x slower per token than 1Mi-token ones, even from its cache).
With a ``BlockCache``, reads cover whole aligned blocks instead, missing blocks that are consecutive
in a segment share one read (up to ``max_read_tokens``), and cached blocks cost no read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorstore as ts

from .arrays import DEFAULT_CHUNK_SIZE
from .blocks import BlockCache

DEFAULT_MAX_READ_TOKENS = 4 * DEFAULT_CHUNK_SIZE  # chunk-aligned, so cuts never split a zarr chunk


@dataclass(frozen=True)
class Segment:
    """One data array placed in the global token space.

    Attributes:
        key: the data array's path; identifies its blocks in a (possibly shared) ``BlockCache``.
        token_start: global offset of the array's first token.
        tokens: committed tokens in the array.
        data: the open array.
    """

    key: str
    token_start: int
    tokens: int
    data: ts.TensorStore


@dataclass(frozen=True)
class Fetched:
    """The runs' tokens back to back, and what it cost."""

    buffer: np.ndarray
    reads_issued: int
    bytes_read: int


def fetch_runs(
    segments: list[Segment],
    run_starts: np.ndarray,
    run_offsets: np.ndarray,
    *,
    dtype: np.dtype,
    block_cache: BlockCache | None = None,
    max_read_tokens: int = DEFAULT_MAX_READ_TOKENS,
) -> Fetched:
    """Reads runs ``[run_starts[r], run_starts[r] + run_offsets[r+1] - run_offsets[r])`` into one buffer.

    Args:
        segments: non-empty segments in token order, covering every run.
        run_starts: int64 ``[R]`` global first token of each run.
        run_offsets: int64 ``[R + 1]`` position of each run in the output buffer.
        dtype: the on-disk token dtype (the buffer's dtype).
        block_cache: read whole blocks through this LRU instead of exact ranges.
        max_read_tokens: longest single read; longer runs are cut at its multiples.

    Returns:
        ``buffer[run_offsets[r] : run_offsets[r + 1]]`` holds run ``r``.
    """
    pieces = list(_pieces(segments, run_starts, run_offsets))
    if block_cache is None:
        pieces = list(_cut(pieces, max_read_tokens))
        with ts.Batch() as batch:
            futures = [seg.data[lo:hi].read(batch=batch) for _, seg, lo, hi in pieces]
        arrays = [f.result() for f in futures]
        nbytes = sum(a.nbytes for a in arrays)
        if len(arrays) == 1:
            return Fetched(arrays[0], 1, nbytes)
        buffer = np.empty(int(run_offsets[-1]), dtype=dtype)
        for (dest, _, lo, hi), array in zip(pieces, arrays, strict=True):
            buffer[dest : dest + hi - lo] = array
        return Fetched(buffer, len(arrays), nbytes)
    return _fetch_blocks(
        pieces, int(run_offsets[-1]), dtype, block_cache, max(1, max_read_tokens // block_cache.block_tokens)
    )


def _pieces(segments: list[Segment], run_starts: np.ndarray, run_offsets: np.ndarray):
    """Yields ``(buffer position, segment, local start, local end)`` for each run split at segments."""
    seg_starts = np.array([s.token_start for s in segments], dtype=np.int64)
    for r, start in enumerate(run_starts.tolist()):
        dest, end = int(run_offsets[r]), start + int(run_offsets[r + 1] - run_offsets[r])
        i = int(np.searchsorted(seg_starts, start, side="right")) - 1
        while start < end:
            seg = segments[i]
            hi = min(end, seg.token_start + seg.tokens)
            yield dest, seg, start - seg.token_start, hi - seg.token_start
            dest, start, i = dest + hi - start, hi, i + 1


def _cut(pieces, limit: int):
    """Splits pieces longer than ``limit`` at multiples of ``limit`` (in the segment's coordinates)."""
    for dest, seg, lo, hi in pieces:
        while hi - lo > limit:
            cut = (lo // limit + 1) * limit
            yield dest, seg, lo, cut
            dest, lo = dest + cut - lo, cut
        yield dest, seg, lo, hi


def _fetch_blocks(pieces, total: int, dtype: np.dtype, cache: BlockCache, max_group: int) -> Fetched:
    size = cache.block_tokens
    blocks: dict[tuple, np.ndarray] = {}  # this request's blocks: kept even if the LRU evicts them
    missing: dict[tuple, tuple[Segment, int]] = {}
    for _, seg, lo, hi in pieces:
        for k in range(lo // size, (hi - 1) // size + 1):
            key = (seg.key, k, min(size, seg.tokens - k * size))  # a growing tail block is a new key
            if key in blocks or key in missing:
                continue
            block = cache.get(key)
            if block is None:
                missing[key] = (seg, k)
            else:
                blocks[key] = block

    # consecutive missing blocks of one segment share a read
    groups: list[list[tuple]] = []
    for key in sorted(missing, key=lambda key: (missing[key][0].token_start, key[1])):
        seg, k = missing[key]
        last = groups[-1][-1] if groups else None
        if last is not None and missing[last] == (seg, k - 1) and len(groups[-1]) < max_group:
            groups[-1].append(key)
        else:
            groups.append([key])
    with ts.Batch() as batch:
        futures = []
        for group in groups:
            seg, k0 = missing[group[0]]
            futures.append(seg.data[k0 * size : min((k0 + len(group)) * size, seg.tokens)].read(batch=batch))
    nbytes = 0
    for group, future in zip(groups, futures, strict=True):
        array = future.result()
        nbytes += array.nbytes
        for j, key in enumerate(group):
            block = array if len(group) == 1 else array[j * size : (j + 1) * size].copy()
            blocks[key] = block
            cache.put(key, block)

    buffer = np.empty(total, dtype=dtype)
    for dest, seg, lo, hi in pieces:
        pos = lo
        while pos < hi:
            k = pos // size
            block = blocks[(seg.key, k, min(size, seg.tokens - k * size))]
            take = min(hi, (k + 1) * size) - pos
            buffer[dest : dest + take] = block[pos - k * size : pos - k * size + take]
            dest, pos = dest + take, pos + take
    return Fetched(buffer, len(futures), nbytes)
