"""Fetch: the host's one job in a step, reading the planned spans into one flat buffer per device.

Every source's spans of this process's rows are coalesced (sorted, deduplicated, adjacent and
overlapping spans merged) and read, all sources in one TensorStore batch. With one device group
(one device, or devices replicating the same rows) they are read straight into its buffer; with
several, into a scratch buffer, and each group's spans are copied into its device's buffer in row
order, a slice per run (one coalesce and one read plan per source and step, not per device). The
buffers are the rows of one ``[devices, size]`` array, which the build takes as it is. Each span's
offset in the buffer goes with it:

    one group: span (source 0, 96, 32), (source 0, 0, 32), (source 1, 7, 10), (source 0, 0, 32)
    buffer = [margin zeros | src0 tokens 0..31 | src0 96..127 | src1 7..16 | zeros to capacity | margin]
    offsets = [[m + 32], [m], [m + 64], [m]]                    (the repeated span is read once)

A buffer's size is static (``rows x max_row_tokens`` plus the margins), so build never recompiles.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

import numpy as np

from meshbatch.cache import TokenCache, run_reads
from meshbatch.cache.read.many import ReadSpace
from meshbatch.datasets.protocol import Dataset, Spans

from .prefetch import wait_turn
from .row_layout import RowLayout
from .telemetry import record_read


def check_spans(dataset: Dataset, spans: Spans, rows: int) -> None:
    """Raises when a dataset's spans break its own declared shape or capacity (a dataset bug)."""
    name = type(dataset).__name__
    shape = (rows, dataset.spans_per_row)
    for field, array in zip(Spans._fields, spans, strict=True):
        if (
            not isinstance(array, np.ndarray)
            or array.shape != shape
            or not np.issubdtype(array.dtype, np.integer)
        ):
            raise ValueError(
                f"{name}.spans gave {field} {getattr(array, 'shape', array)}; expected int {shape}"
            )
    if spans.length.size and spans.length.min() < 0:
        raise ValueError(f"{name}.spans gave a negative length {int(spans.length.min())}")
    used = spans.source[spans.length > 0]
    if used.size and (used.min() < 0 or used.max() >= len(dataset.sources)):
        raise ValueError(f"{name}.spans named source {int(used.max())} of {len(dataset.sources)}")
    widest = int(spans.length.sum(axis=1).max(initial=0))
    if widest > dataset.max_row_tokens:
        raise ValueError(
            f"{name} planned a row of {widest} tokens > its max_row_tokens={dataset.max_row_tokens}"
        )


def fetch(dataset: Dataset, spans: Spans, layout: RowLayout) -> tuple[np.ndarray, np.ndarray]:
    """Reads ``spans`` (rows in ``layout.rows`` order) into one buffer per device of ``layout``
    (see the module docstring; several groups' spans are copied from the scratch by ``copy_spans``,
    and a device replicating another's rows gets a copy of its buffer).

    Returns:
        ``(tokens, offsets)`` stacked in ``layout.devices`` order: int32
        ``[devices, 2 * margin + rows_per_device * max_row_tokens]`` and int32
        ``[devices, rows_per_device, spans_per_row]`` (``tokens.reshape(-1)`` is the build's input).
    """
    check_spans(dataset, spans, layout.rows.shape[0])
    margin = dataset.content_margin
    size = 2 * margin + layout.rows_per_device * dataset.max_row_tokens
    devices = len(layout.devices)
    tokens = np.empty((devices, size), np.int32)
    offsets = np.empty((devices, layout.rows_per_device, dataset.spans_per_row), np.int32)
    firsts = [layout.device_group.index(g) for g in range(len(layout.groups))]
    if layout.identity:
        _, offsets[0] = _read_group(dataset, spans, layout.rows_per_device, out=tokens[0])
    else:
        # Scratch: every source's unique runs back to back (never more than all spans' tokens).
        scratch, where = _read_group(dataset, spans, layout.rows.shape[0], margin=0)
        for index, d in zip(layout.groups, firsts, strict=True):
            length = spans.length[index]
            flat = length.reshape(-1)
            begins = np.cumsum(flat) - flat  # each span's place after the margin, in row order
            total = int(flat.sum())
            copy_spans(scratch, where[index].reshape(-1), flat, tokens[d, margin : margin + total])
            tokens[d, :margin] = 0
            tokens[d, margin + total :] = 0
            offsets[d] = np.where(length > 0, margin + begins.reshape(length.shape), 0)
    for d, g in enumerate(layout.device_group):  # replicas of a group's rows: the same buffer
        if d != firsts[g]:
            tokens[d], offsets[d] = tokens[firsts[g]], offsets[firsts[g]]
    return tokens, offsets


MIN_RUN_TOKENS = 256  # below this mean run length one vectorised gather beats a slice copy per run


def copy_spans(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray) -> None:
    """Copies spans ``source[starts[i] : starts[i] + lengths[i]]`` back to back into ``out``.

    Spans that follow each other in ``source`` too form one run, copied as one slice; when runs
    are short on average (< ``MIN_RUN_TOKENS``), one gather copies every token instead:

        source = [a b c d e f], starts = [2, 4, 0], lengths = [2, 2, 1]
        runs: source[2:6] (spans 0 and 1 are adjacent), source[0:1]  ->  out = [c d e f a]
    """
    keep = lengths > 0
    starts, lengths = starts[keep].astype(np.int64), lengths[keep].astype(np.int64)
    if not starts.size:
        return
    firsts = np.flatnonzero(np.r_[True, starts[1:] != starts[:-1] + lengths[:-1]])
    run_starts, run_lengths = starts[firsts], np.add.reduceat(lengths, firsts)
    placed = np.cumsum(run_lengths) - run_lengths
    if run_starts.size * MIN_RUN_TOKENS <= out.shape[0]:
        for s, at, n in zip(run_starts.tolist(), placed.tolist(), run_lengths.tolist(), strict=True):
            out[at : at + n] = source[s : s + n]
    else:
        index = np.dtype(np.int32 if source.shape[0] < 2**31 else np.int64)
        shift = np.repeat((run_starts - placed).astype(index), run_lengths)
        np.take(source, np.arange(out.shape[0], dtype=index) + shift, out=out)


def fetch_rows(dataset: Dataset, spans: Spans) -> tuple[np.ndarray, np.ndarray]:
    """Reads ``spans`` of every planned row as one group (one host, one device): ``(tokens,
    offsets)`` as ``fetch`` gives a device group, for a caller that builds rows by index."""
    rows = spans.source.shape[0]
    check_spans(dataset, spans, rows)
    return _read_group(dataset, spans, rows)


def _read_group(
    dataset: Dataset, spans: Spans, rows: int, *, margin: int | None = None, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One group's spans read into one flat buffer (``out``, or a new one): each source coalesced,
    placed after the previous one, with ``margin`` (default ``content_margin``) zeros either side.
    Returns ``(buffer, each span's offset in it)``.

    The reads' latency is recorded in the producing stream's log (``telemetry``); the host work
    after them (copies into place) waits for the producer's turn (``prefetch.Shadow``)."""
    margin = dataset.content_margin if margin is None else margin
    size = 2 * margin + rows * dataset.max_row_tokens
    buffer = np.empty(size, np.int32) if out is None else out
    source, start, length = spans
    where = np.zeros(start.shape, np.int64)
    # the spans grouped by source once (a sort), not a mask per source: a step's host work
    # grows with the sources it reads, not with the sources the dataset has
    flat = np.flatnonzero(length.reshape(-1) > 0)
    order = flat[np.argsort(source.reshape(-1)[flat], kind="stable")]
    present, first = np.unique(source.reshape(-1)[order], return_index=True)
    bounds = np.append(first, order.size)
    flat_start, flat_length, flat_where = start.reshape(-1), length.reshape(-1), where.reshape(-1)
    space = read_space(dataset) if present.size and one_plan() else None
    if space is not None:
        # the caches as one token space: one bounds check, coalesce and read plan (cache/many.py),
        # from what the space keeps of them (one cache too: no lazily opened part looked up again)
        many = space.prepare(source.reshape(-1)[order], flat_start[order], flat_length[order], buffer, margin)
        flat_where[order] = many.span_starts
        reads, at = many.reads, many.end
    else:
        reads, at = [], margin
        for i, s in enumerate(present.tolist()):
            mine = order[bounds[i] : bounds[i + 1]]  # this source's spans, in row order
            read = dataset.sources[s].prepare_read(flat_start[mine], flat_length[mine], buffer, at)
            flat_where[mine] = read.span_starts
            at = read.end
            reads.append(read)
    buffer[:margin] = 0
    buffer[at:] = 0
    began = time.perf_counter()

    def after_io() -> None:
        record_read(time.perf_counter() - began)
        wait_turn()

    run_reads(reads, after_io=after_io)
    return buffer, where.astype(np.int32)


_SPACES: dict[int, ReadSpace | None] = {}  # by id of a live dataset (its entry goes with it)
_SPACES_LOCK = threading.Lock()


def read_space(dataset: Dataset) -> ReadSpace | None:
    """The ``ReadSpace`` of ``dataset``'s sources, kept while the dataset lives (what a step's read
    plan needs of every cache, learnt once), or ``None`` when a source is not a ``TokenCache``."""
    key = id(dataset)
    space = _SPACES.get(key, False)
    if space is not False:
        return space
    sources = dataset.sources
    space = ReadSpace(sources) if all(isinstance(cache, TokenCache) for cache in sources) else None
    try:
        weakref.finalize(dataset, _SPACES.pop, key, None)
    except TypeError:  # a dataset that cannot be referenced weakly: a space per step
        return space
    with _SPACES_LOCK:
        return _SPACES.setdefault(key, space)


PLAN_ENV = "MESHBATCH_FETCH_PLAN"  # "one" (default): one read plan for all caches of a step; "per-source"


def one_plan() -> bool:
    """Whether a step's TokenCache sources share one read plan (``MESHBATCH_FETCH_PLAN``, default
    ``one``); ``per-source`` plans each source's read on its own.

    Raises:
        ValueError: any other value, named.
    """
    value = os.environ.get(PLAN_ENV, "one").strip().lower()
    if value not in ("one", "per-source"):
        raise ValueError(f"{PLAN_ENV} must be 'one' or 'per-source' (got {PLAN_ENV}={value!r})")
    return value == "one"
