"""What a reader has loaded of a cache: one immutable snapshot of its offsets and data segments.

Loading is incremental (only new rows and new shards are read) and a refresh replaces the whole
snapshot at once, so a read planned while another thread refreshes sees the old rows or the new
ones, never offsets from one and segments from the other::

    snapshot 1: rows 0..99, segment part-0 [0, 7000)
    refresh  -> snapshot 2: rows 0..149, segments part-0 [0, 7000), part-1 [7000, 11000)
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorstore as ts

from meshbatch.cache.format.arrays import FieldArrays
from meshbatch.cache.format.checks import CacheIntegrityError, check_dtype
from meshbatch.cache.format.ledger import CONSOLIDATED, LEDGER_FILE_NAME, Ledger
from meshbatch.cache.format.shard_table import check_distinct_shards, shard_root, shard_table
from meshbatch.cache.read.parts import load_part
from meshbatch.cache.read.reads import Segment


@dataclasses.dataclass(frozen=True)
class Contents:
    """A cache's loaded rows.

    Attributes:
        ledger: the ledger they were loaded from (``None`` before the first load).
        offsets: int64 ``[rows + 1]`` global token offsets, starting at 0.
        segments: the data arrays placed in the global token space, in order.
        dtype: the on-disk token dtype (``None`` while no data array is open).
        parts: shard names loaded (``("",)`` for a consolidated cache).
        arrays: the consolidated layout's open arrays, reused by the next load.
    """

    ledger: Ledger | None = None
    offsets: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(1, np.int64))
    segments: tuple[Segment, ...] = ()
    dtype: np.dtype | None = None
    parts: tuple[str, ...] = ()
    arrays: FieldArrays | None = None

    @property
    def num_rows(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def segments_for(self, run_starts: np.ndarray, run_ends: np.ndarray) -> list[Segment]:
        """The segments that tokens ``[run_starts[r], run_ends[r])`` touch, in token order."""
        if run_starts.size == 0 or not self.segments:
            return []
        if len(self.segments) == 1:
            return list(self.segments)
        starts = np.array([s.token_start for s in self.segments], dtype=np.int64)
        first = np.searchsorted(starts, run_starts, side="right") - 1
        last = np.searchsorted(starts, run_ends - 1, side="right") - 1
        touched = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last, strict=True)]))
        return [self.segments[i] for i in touched.tolist()]

    def row_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global token start and end of each of ``rows``."""
        return self.offsets[rows], self.offsets[rows + 1]

    def all_offsets(self) -> np.ndarray:
        return self.offsets


def load_contents(
    path: str,
    field: str,
    ledger: Ledger,
    old: Contents,
    *,
    context: ts.Context,
    expected: np.dtype | None,
    verify: bool = True,
    shard_sidecars: Mapping[str, bool] | None = None,
) -> Contents:
    """``old`` brought up to ``ledger``; only new rows and new shards are read.

    With ``verify``, each segment carries the verifier of its data chunks (``verify.py``). A part
    whose ledger says ``meshbatch_checksums: true`` (the cache's own ledger for the consolidated
    layout; for a shard ``shard_sidecars[name]``, from its ledger) must have its checksum sidecar.

    Raises:
        CacheIntegrityError: a changed layout, fewer rows than loaded, rewritten shards, a dtype
            that differs from ``expected`` or between shards, or any check of ``load_part``.
    """
    if old.ledger is not None and ledger.layout != old.ledger.layout:
        raise CacheIntegrityError(
            f"cache at {path} changed layout {old.ledger.layout!r} -> {ledger.layout!r}"
        )
    if ledger.layout == CONSOLIDATED:
        return _consolidated(path, field, ledger, old, context=context, expected=expected, verify=verify)
    required = dict(shard_sidecars or {})
    return _sharded(
        path, field, ledger, old, context=context, expected=expected, verify=verify, required=required
    )


def _dtype(
    data: ts.TensorStore, expected: np.dtype | None, loaded: np.dtype | None, *, where: str
) -> np.dtype:
    found = np.dtype(data.dtype.numpy_dtype)
    check_dtype(found, expected, where=where)
    check_dtype(found, loaded, where=where)  # every shard must agree with the first
    return found


def _consolidated(path, field, ledger: Ledger, old: Contents, *, context, expected, verify) -> Contents:
    rows, loaded = ledger.total_num_rows, old.offsets.shape[0] - 1
    if rows < loaded:
        raise CacheIntegrityError(f"cache at {path} went backwards: {rows} rows < {loaded} loaded")
    before = old.segments[0].verifier if old.segments else None
    arrays, offsets, verifier = load_part(
        path,
        field,
        rows=rows,
        finished=ledger.is_finished,
        recorded=ledger.field_counts.get(field),
        context=context,
        arrays=old.arrays,
        loaded=old.offsets,
        verify=verify,
        verified=before.verified() if before is not None else frozenset(),
        sidecar_required=ledger.meshbatch_checksums,
    )
    dtype = _dtype(arrays.data, expected, old.dtype, where=arrays.data_path)
    segment = Segment(arrays.data_path, 0, int(offsets[-1]), arrays.data, path, verifier)
    return Contents(ledger, offsets, (segment,), dtype, ("",), arrays)


def _sharded(path, field, ledger: Ledger, old: Contents, *, context, expected, verify, required) -> Contents:
    entries = shard_table(ledger, field, where=posixpath.join(path, LEDGER_FILE_NAME))
    loaded = len(old.parts)
    if tuple(e.name for e in entries[:loaded]) != old.parts:
        raise CacheIntegrityError(
            f"sharded cache at {path} rewrote its finished shards: had {list(old.parts)}, "
            f"ledger now lists {[e.name for e in entries]}"
        )

    if len(entries) > loaded:
        check_distinct_shards(path, [e.name for e in entries])

    def load(entry):
        root = shard_root(path, entry.name)
        arrays, offsets, verifier = load_part(
            root,
            field,
            rows=entry.rows,
            finished=True,
            recorded=entry.tokens,
            context=context,
            verify=verify,
            sidecar_required=required.get(entry.name, False),
        )
        return arrays.data, offsets, verifier

    with ThreadPoolExecutor(max_workers=16) as pool:  # opens are I/O-latency bound
        loaded_parts = list(pool.map(load, entries[loaded:]))
    offsets, segments, dtype = [old.offsets], list(old.segments), old.dtype
    start = int(old.offsets[-1])
    for entry, (data, shard_offsets, verifier) in zip(entries[loaded:], loaded_parts, strict=True):
        where = posixpath.join(path, entry.name, field, "data")
        dtype = _dtype(data, expected, dtype, where=where)
        offsets.append(shard_offsets[1:] + start)
        if entry.tokens:
            segments.append(Segment(where, start, entry.tokens, data, path, verifier, part=entry.name))
        start += entry.tokens
    parts = tuple(e.name for e in entries)
    return Contents(ledger, np.concatenate(offsets), tuple(segments), dtype, parts, None)
