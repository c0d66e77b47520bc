"""Span coalescing: many requested token spans become few contiguous reads.

Spans ``(start, length)`` arrive in any order, with duplicates and overlaps. They are sorted, and
spans that overlap or touch merge into one *run*; each run is read once, the runs are laid end to
end in one buffer, and every requested span is located inside that buffer::

    seq_len = 4, rows [3, 1, 2, 2, 4, 9, 8] -> starts = [12, 4, 8, 8, 16, 36, 32], lengths = 4
    runs          = [(4, 16), (32, 8)]       # tokens 4..20 and 32..40: 2 reads
    run_offsets   = [0, 16, 24]              # where each run begins in the buffer
    span_starts   = [8, 0, 4, 4, 12, 20, 16] # where each requested span begins in the buffer

Counters (``ReadCounters``) record spans requested, unique spans, runs, reads issued and bytes read.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import numpy as np

from meshbatch.cache.format.checks import as_index_array


@dataclass(frozen=True)
class Coalesced:
    """Runs covering a set of spans, and where each span lies in the runs' concatenation.

    Attributes:
        run_starts: int64 ``[R]``, first token of each run, ascending, runs disjoint and non-touching.
        run_lengths: int64 ``[R]``, tokens in each run (all > 0).
        run_offsets: int64 ``[R + 1]``, where each run begins in the concatenated buffer.
        span_starts: int64 ``[n]``, where each requested span begins in the buffer, in request order
            (duplicates point at the same place; empty spans point at 0).
        unique_spans: number of distinct non-empty ``(start, length)`` pairs requested.
    """

    run_starts: np.ndarray
    run_lengths: np.ndarray
    run_offsets: np.ndarray
    span_starts: np.ndarray
    unique_spans: int


def as_spans(starts, lengths) -> tuple[np.ndarray, np.ndarray]:
    """Validates and converts span arrays to int64 ``[n]`` (a scalar ``lengths`` applies to every span).

    Raises:
        TypeError: values that are not integers (floats, strings, bools, objects).
        ValueError: shapes differ or are not 1-D, a value outside int64, or any is negative.
    """
    starts_arr, lengths_arr = as_index_array("starts", starts), as_index_array("lengths", lengths)
    if np.ndim(starts) != 1:
        raise ValueError(f"starts must be 1-D (got starts={starts!r:.80})")
    if np.ndim(lengths) == 0:
        lengths_arr = np.broadcast_to(lengths_arr, starts_arr.shape)
    if starts_arr.shape != lengths_arr.shape:
        raise ValueError(
            f"starts and lengths must be 1-D of equal length (got {starts_arr.shape=}, {lengths_arr.shape=})"
        )
    for name, arr in (("starts", starts_arr), ("lengths", lengths_arr)):
        if arr.size and arr.min() < 0:
            i = int(np.argmin(arr))
            raise ValueError(f"{name} must be >= 0 (got {name}[{i}]={int(arr[i])})")
    return starts_arr, lengths_arr


def coalesce_spans(starts: np.ndarray, lengths: np.ndarray) -> Coalesced:
    """Merges spans into sorted, disjoint runs; overlapping and adjacent spans share a run.

    Args:
        starts: int64 ``[n]`` first token of each span (see ``as_spans``).
        lengths: int64 ``[n]`` tokens in each span; empty spans are allowed and read nothing.

    Returns:
        The runs and each span's position in their concatenation.
    """
    n = starts.shape[0]
    if n <= SMALL_SPANS:
        return _coalesce_few(starts.tolist(), lengths.tolist())
    runs = coalesce_sources(starts, lengths, np.zeros(n, np.int64), 1)
    return Coalesced(
        runs.run_starts, runs.run_lengths, runs.run_offsets, runs.span_starts, int(runs.unique[0])
    )


@dataclass(frozen=True)
class SourceRuns:
    """Spans of ``k`` sources coalesced together (``Coalesced``, with each run's and each source's
    counts); spans of two sources never share a run (``many.py`` places them a token apart)."""

    run_starts: np.ndarray  # int64 [R] first token of each run
    run_lengths: np.ndarray  # int64 [R]
    run_offsets: np.ndarray  # int64 [R + 1] from 0
    span_starts: np.ndarray  # int64 [n] from 0 (empty spans: 0)
    run_slot: np.ndarray  # int64 [R] each run's source
    first_run: np.ndarray  # int64 [k + 1] each source's first run (runs of source j: first_run[j:j+2])
    unique: np.ndarray  # int64 [k] distinct non-empty spans of each source
    requested: np.ndarray  # int64 [k] spans of each source


def coalesce_sources(starts: np.ndarray, lengths: np.ndarray, slot: np.ndarray, k: int) -> SourceRuns:
    """``coalesce_spans`` of spans whose source is ``slot`` (ints in ``[0, k)``), vectorised.

    Spans sorted by (start, end) begin a new run where one starts strictly after everything before
    it ends.
    """
    n = starts.shape[0]
    span_starts = np.zeros(n, dtype=np.int64)
    nonempty = np.flatnonzero(lengths > 0)
    s, e = starts[nonempty], starts[nonempty] + lengths[nonempty]
    order = np.lexsort((e, s))
    s_sorted, e_sorted, slot_sorted = s[order], e[order], slot[nonempty][order]
    if s_sorted.size:
        reach = np.maximum.accumulate(e_sorted)
        new_run = np.empty(s_sorted.shape, dtype=bool)
        new_run[0] = True
        new_run[1:] = s_sorted[1:] > reach[:-1]
        run_id = np.cumsum(new_run) - 1
        first = np.flatnonzero(new_run)
        last = np.append(first[1:] - 1, s_sorted.size - 1)
        run_starts = s_sorted[first]
        run_lengths = reach[last] - run_starts
        distinct = np.empty(s_sorted.shape, dtype=bool)
        distinct[0] = True
        distinct[1:] = (s_sorted[1:] != s_sorted[:-1]) | (e_sorted[1:] != e_sorted[:-1])
        run_slot = slot_sorted[first]
        unique = np.bincount(slot_sorted[distinct], minlength=k)
    else:
        run_starts = run_lengths = run_slot = np.zeros(0, np.int64)
        unique = np.zeros(k, np.int64)
    run_offsets = np.zeros(run_starts.size + 1, dtype=np.int64)
    np.cumsum(run_lengths, out=run_offsets[1:])
    if s_sorted.size:
        located = np.empty_like(s_sorted)
        located[order] = run_offsets[run_id] + (s_sorted - run_starts[run_id])
        span_starts[nonempty] = located
    first_run = np.searchsorted(run_slot, np.arange(k + 1))
    requested = np.bincount(slot, minlength=k)
    return SourceRuns(
        run_starts, run_lengths, run_offsets, span_starts, run_slot, first_run, unique, requested
    )


SMALL_SPANS = 32  # up to this many spans, plain Python beats a dozen numpy calls on tiny arrays


def _coalesce_few(starts: list[int], lengths: list[int]) -> Coalesced:
    """``coalesce_spans`` of a few spans in plain Python (a mixture of many sources reads a few
    spans of each source a step): the same runs, offsets and counts."""
    spans = sorted((s, s + n, i) for i, (s, n) in enumerate(zip(starts, lengths, strict=True)) if n > 0)
    run_starts, run_lengths, run_offsets, located = [], [], [0], {}
    reach = -1
    for s, e, i in spans:
        if s > reach:  # a new run: this span starts strictly after everything before it ends
            run_starts.append(s)
            run_lengths.append(0)
            reach = s
        reach = max(reach, e)
        run_lengths[-1] = reach - run_starts[-1]
        located[i] = (len(run_starts) - 1, s - run_starts[-1])
    for length in run_lengths:
        run_offsets.append(run_offsets[-1] + length)
    span_starts = [0] * len(starts)
    for i, (run, within) in located.items():
        span_starts[i] = run_offsets[run] + within
    distinct = len({(s, e) for s, e, _ in spans})
    return Coalesced(
        np.asarray(run_starts, np.int64),
        np.asarray(run_lengths, np.int64),
        np.asarray(run_offsets, np.int64),
        np.asarray(span_starts, np.int64),
        distinct,
    )


@dataclass(frozen=True)
class SpanRead:
    """Requested spans in request order: span ``i`` is ``tokens[offsets[i] : offsets[i + 1]]``."""

    tokens: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


@dataclass(frozen=True)
class RunRead:
    """Coalesced read: unique runs back to back, and where each requested span lies in them.

    Attributes:
        buffer: the runs' tokens, on-disk dtype.
        run_starts: int64 ``[R]`` global first token of each run.
        run_offsets: int64 ``[R + 1]`` where each run begins in ``buffer``.
        span_starts: int64 ``[n]`` where requested span ``i`` begins in ``buffer`` (request order).
        span_lengths: int64 ``[n]`` its length.
    """

    buffer: np.ndarray
    run_starts: np.ndarray
    run_offsets: np.ndarray
    span_starts: np.ndarray
    span_lengths: np.ndarray

    def spans(self) -> SpanRead:
        """Gathers the spans in request order (duplicates copied) into one flat buffer."""
        offsets = np.zeros(self.span_lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(self.span_lengths, out=offsets[1:])
        if offsets[-1] == self.buffer.shape[0] and np.array_equal(self.span_starts, offsets[:-1]):
            return SpanRead(self.buffer, offsets)  # spans already lie back to back in request order
        pieces = [
            self.buffer[s : s + n]
            for s, n in zip(self.span_starts.tolist(), self.span_lengths.tolist(), strict=True)
        ]
        tokens = np.concatenate(pieces) if pieces else self.buffer[:0].copy()
        return SpanRead(tokens, offsets)


_COUNTERS_LOCK = threading.Lock()  # one for every reader's counters: a plan of many caches takes it once


@dataclass
class ReadCounters:
    """Cumulative read-efficiency counters of one ``TokenCache`` (thread-safe).

    ``reads_issued`` counts TensorStore reads actually issued: runs split where they cross a shard
    boundary, minus what the block cache served. ``bytes_read`` counts the bytes those reads returned.
    """

    spans_requested: int = 0
    unique_spans: int = 0
    runs: int = 0
    reads_issued: int = 0
    bytes_read: int = 0

    def add(
        self,
        *,
        spans_requested: int = 0,
        unique_spans: int = 0,
        runs: int = 0,
        reads_issued: int = 0,
        bytes_read: int = 0,
    ) -> None:
        """Adds one request's counts."""
        with _COUNTERS_LOCK:
            self.spans_requested += spans_requested
            self.unique_spans += unique_spans
            self.runs += runs
            self.reads_issued += reads_issued
            self.bytes_read += bytes_read

    @staticmethod
    def add_each(counters: list[ReadCounters], counts) -> None:
        """Adds to each of ``counters`` its ``(spans_requested, unique_spans, runs, reads_issued,
        bytes_read)`` from ``counts`` (the caches of one plan, under one lock)."""
        with _COUNTERS_LOCK:
            for c, (requested, unique, runs, reads, nbytes) in zip(counters, counts, strict=True):
                c.spans_requested += requested
                c.unique_spans += unique
                c.runs += runs
                c.reads_issued += reads
                c.bytes_read += nbytes

    def reset(self) -> None:
        """Zeroes every counter."""
        with _COUNTERS_LOCK:
            self.spans_requested = self.unique_spans = self.runs = self.reads_issued = self.bytes_read = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict (a consistent snapshot)."""
        with _COUNTERS_LOCK:
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
