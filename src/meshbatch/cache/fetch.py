"""Fetching coalesced runs: one TensorStore read per run, all in one batch, into one buffer.

The global token space is the concatenation of *segments*, one per data array (one for a
consolidated cache, one per non-empty shard of a sharded cache). A run that crosses a segment
boundary is read as one piece per segment::

    segments: part-0 holds tokens [0, 7), part-1 holds [7, 16)
    run (5, 4) = tokens [5, 9) -> part-0 data[5:7] and part-1 data[0:2]: 2 reads, buffer[0:2], [2:4]

All reads go through one ``ts.Batch`` with ``batch=`` on every read (a bare ``with ts.Batch():``
batches nothing), and TensorStore decodes each straight into its place in the output buffer.
With a ``BlockCache``, reads cover whole aligned blocks instead, missing blocks that are consecutive
in a segment share one read, and cached blocks cost no read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorstore as ts

from .blocks import BlockCache


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
) -> Fetched:
    """Reads runs ``[run_starts[r], run_starts[r] + run_offsets[r+1] - run_offsets[r])`` into one buffer.

    Args:
        segments: non-empty segments in token order, covering every run.
        run_starts: int64 ``[R]`` global first token of each run.
        run_offsets: int64 ``[R + 1]`` position of each run in the output buffer.
        dtype: the on-disk token dtype (the buffer's dtype).
        block_cache: read whole blocks through this LRU instead of exact ranges.

    Returns:
        ``buffer[run_offsets[r] : run_offsets[r + 1]]`` holds run ``r``.
    """
    pieces = list(_pieces(segments, run_starts, run_offsets))
    if block_cache is None:
        buffer = np.empty(int(run_offsets[-1]), dtype=dtype)
        _read_into([(buffer[dest : dest + hi - lo], seg.data[lo:hi]) for dest, seg, lo, hi in pieces])
        return Fetched(buffer, len(pieces), buffer.nbytes)
    return _fetch_blocks(pieces, int(run_offsets[-1]), dtype, block_cache)


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


def _read_into(targets: list[tuple[np.ndarray, ts.TensorStore]]) -> None:
    """Reads each source into its destination array, all in one ``ts.Batch``.

    TensorStore decodes straight into the destination (a ``ts.array`` view of it): no intermediate
    array (measured 2-3x faster than ``read()`` plus a copy for multi-MiB reads).
    """
    with ts.Batch() as batch:
        futures = [
            ts.array(dest, copy=False, write=True).write(source, batch=batch) for dest, source in targets
        ]
    for future in futures:
        future.result()


def _block_key(seg: Segment, k: int, size: int) -> tuple:
    """Block ``k`` of ``seg``; its length is part of the key, so a tail block that grew is a new block."""
    return (seg.key, k, min(size, seg.tokens - k * size))


def _fetch_blocks(pieces, total: int, dtype: np.dtype, cache: BlockCache) -> Fetched:
    size = cache.block_tokens
    blocks: dict[tuple, np.ndarray] = {}  # this request's blocks: kept even if the LRU evicts them
    missing: dict[tuple, tuple[Segment, int]] = {}
    for _, seg, lo, hi in pieces:
        for k in range(lo // size, (hi - 1) // size + 1):
            key = _block_key(seg, k, size)
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
        previous = missing[groups[-1][-1]] if groups else None
        if previous is not None and previous[0] is seg and previous[1] == k - 1:
            groups[-1].append(key)
        else:
            groups.append([key])
    targets = []
    for group in groups:
        seg, k0 = missing[group[0]]
        lo, hi = k0 * size, min((k0 + len(group)) * size, seg.tokens)
        targets.append((np.empty(hi - lo, dtype=dtype), seg.data[lo:hi]))
    _read_into(targets)
    nbytes = 0
    for group, (array, _) in zip(groups, targets, strict=True):
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
            block = blocks[_block_key(seg, k, size)]
            take = min(hi, (k + 1) * size) - pos
            buffer[dest : dest + take] = block[pos - k * size : pos - k * size + take]
            dest, pos = dest + take, pos + take
    return Fetched(buffer, len(targets), nbytes)
