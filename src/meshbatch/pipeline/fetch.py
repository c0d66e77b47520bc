"""Fetch: the host's one job in a step, reading the planned spans into one flat buffer per device.

Every source's spans of this process's rows are coalesced (sorted, deduplicated, adjacent and
overlapping spans merged) and read, all sources in one TensorStore batch. With one device group
(one device, or devices replicating the same rows) they are read straight into its buffer; with
several, into a scratch buffer, and each group's spans are copied into its buffer in row order
(one coalesce and one read plan per source and step, not per device). Each span's offset in the
buffer goes with it:

    one group: span (source 0, 96, 32), (source 0, 0, 32), (source 1, 7, 10), (source 0, 0, 32)
    buffer = [margin zeros | src0 tokens 0..31 | src0 96..127 | src1 7..16 | zeros to capacity | margin]
    offsets = [[m + 32], [m], [m + 64], [m]]                    (the repeated span is read once)

A buffer's size is static (``rows x max_row_tokens`` plus the margins), so build never recompiles.
"""

from __future__ import annotations

import time

import numpy as np

from meshbatch.cache import run_reads
from meshbatch.datasets.protocol import Dataset, Spans

from .row_layout import RowLayout
from .shadow import wait_turn
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


def fetch(dataset: Dataset, spans: Spans, layout: RowLayout) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Reads ``spans`` (rows in ``layout.rows`` order) for each device group of ``layout``.

    One group (one device, or every device holding the same rows) is read straight into its
    buffer. Several groups share one coalesced read per source of all their spans, into a scratch
    buffer, and each group's spans are then copied into its own buffer in row order with one
    vectorised gather: one coalesce and one read plan per source and step, not per device.

    Returns:
        ``(tokens, offsets)`` per group: int32 ``[2 * margin + rows_per_device * max_row_tokens]``
        and int32 ``[rows_per_device, spans_per_row]``.
    """
    check_spans(dataset, spans, layout.rows.shape[0])
    if layout.identity:
        buffer, offsets = _read_group(dataset, spans, layout.rows_per_device)
        return [buffer], [offsets]
    # Scratch: every source's unique runs back to back (never more than all spans' tokens).
    reads, scratch, where = _prepare_group(dataset, spans, layout.rows.shape[0], margin=0)
    _timed_reads(reads)
    margin = dataset.content_margin
    size = 2 * margin + layout.rows_per_device * dataset.max_row_tokens
    buffers, offsets = [], []
    for index in layout.groups:
        length = spans.length[index]
        flat = length.reshape(-1)
        begins = np.cumsum(flat) - flat  # each span's place after the margin, in row order
        total = int(flat.sum())
        # token j of span i: scratch[where[i] + j] -> buffer[margin + begins[i] + j]
        shift = np.repeat(where[index].reshape(-1).astype(np.int64) - begins, flat)
        buffer = np.zeros(size, np.int32)
        buffer[margin : margin + total] = scratch[np.arange(total, dtype=np.int64) + shift]
        buffers.append(buffer)
        offsets.append(np.where(length > 0, margin + begins.reshape(length.shape), 0).astype(np.int32))
    return buffers, offsets


def fetch_rows(dataset: Dataset, spans: Spans) -> tuple[np.ndarray, np.ndarray]:
    """Reads ``spans`` of every planned row as one group (one host, one device): ``(tokens,
    offsets)`` as ``fetch`` gives a device group, for a caller that builds rows by index."""
    rows = spans.source.shape[0]
    check_spans(dataset, spans, rows)
    return _read_group(dataset, spans, rows)


def _read_group(dataset: Dataset, spans: Spans, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """One group's spans read straight into its buffer: ``(tokens, offsets)``."""
    reads, buffer, offsets = _prepare_group(dataset, spans, rows)
    _timed_reads(reads)
    return buffer, offsets


def _prepare_group(
    dataset: Dataset, spans: Spans, rows: int, *, margin: int | None = None
) -> tuple[list, np.ndarray, np.ndarray]:
    """The reads of one group's spans into one flat buffer: each source coalesced, placed after
    the previous one, with ``margin`` (default ``content_margin``) zeros either side."""
    margin = dataset.content_margin if margin is None else margin
    buffer = np.empty(2 * margin + rows * dataset.max_row_tokens, np.int32)
    source, start, length = spans
    where = np.zeros(start.shape, np.int64)
    reads, at = [], margin
    for s, token_source in enumerate(dataset.sources):
        mask = (source == s) & (length > 0)
        if mask.any():
            read = token_source.prepare_read(start[mask], length[mask], buffer, at)
            where[mask] = read.span_starts
            at = read.end
            reads.append(read)
    buffer[:margin] = 0
    buffer[at:] = 0
    return reads, buffer, where.astype(np.int32)


def _timed_reads(reads: list) -> None:
    """``run_reads``, its latency recorded in the producing stream's log (``telemetry``); the host
    work after the reads (copies into place) waits for the producer's turn (``shadow``)."""
    began = time.perf_counter()

    def read() -> None:
        record_read(time.perf_counter() - began)
        wait_turn()

    run_reads(reads, after_io=read)
