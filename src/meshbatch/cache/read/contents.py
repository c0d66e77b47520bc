"""What a reader has loaded of a cache: one immutable snapshot of its offsets and data segments.

Loading is incremental (only new rows and new shards are read) and a refresh replaces the whole
snapshot at once, so a read planned while another thread refreshes sees the old rows or the new
ones, never offsets from one and segments from the other::

    snapshot 1: rows 0..99, segment part-0 [0, 7000)
    refresh  -> snapshot 2: rows 0..149, segments part-0 [0, 7000), part-1 [7000, 11000)

Loading one consolidated part of a cache (the cache itself, or one shard): offsets first, checked.

Every check that costs no token read runs before the bulk offsets read, so a damaged ledger or
offsets array fails by name instead of allocating what it claims::

    ledger rows = 10**12, offsets[0] = 6     -> "offsets[0] = 6 rows on disk, but the ledger commits 10**12"
    read offsets[0] and offsets[rows] only    (one small batch: the count and where the data ends)
    offsets[rows] != ledger field count       -> "reach token 25, but the ledger records 21 tokens"
    then offsets[loaded + 1 : rows + 1]       (only rows not loaded yet), checked monotone
    the data chunk holding the last token     (must exist and decode: no fill values)
    finished: nothing but fill past the end    (rest of that chunk, offsets[rows + 1]: 0 or not stored)
    the checksum sidecar's dtype and counts   (if meshbatch wrote the part; required when its ledger
                                              says meshbatch_checksums: true)
    with verification (``verify.py``): the new offsets' chunks summed against the sidecar, and
    the whole last data chunk read and summed (a chunk copied from a smaller cache reads zeros)
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import tensorstore as ts

from meshbatch.cache.format.arrays import FieldArrays, open_field
from meshbatch.cache.format.checks import (
    CacheIntegrityError,
    check_data_end,
    check_dtype,
    check_extent,
    check_offsets,
    check_row_count,
)
from meshbatch.cache.format.ledger import (
    CONSOLIDATED,
    Ledger,
    check_distinct_shards,
    shard_root,
    shard_table,
)
from meshbatch.cache.integrity.checksums import check_sidecar
from meshbatch.cache.integrity.verify import ChunkVerifier, check_last_chunk, verify_offsets
from meshbatch.cache.read.reads import Segment


class Placed(NamedTuple):
    """A cache's parts that hold tokens, in token order (``many.ReadSpace`` keeps them in arrays).

    Attributes:
        starts, ends: int64 ``[P]``, each part's first token and the token past its last.
        segments: each part's data array, or ``None`` for a part not opened yet (a lazily opened
            cache opens it with ``open_segments``).
    """

    starts: np.ndarray
    ends: np.ndarray
    segments: list[Segment | None]


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

    def placed(self) -> Placed:
        """Every segment holding tokens, placed in the token space (all are open)."""
        filled = [seg for seg in self.segments if seg.tokens]
        starts = np.array([seg.token_start for seg in filled], np.int64)
        ends = starts + np.array([seg.tokens for seg in filled], np.int64)
        return Placed(starts, ends, filled)

    def open_segments(self, placed: list[int]) -> list[Segment]:
        """The segments at ``placed`` (their places in ``placed()``; every one is open)."""
        filled = self.placed().segments
        return [filled[i] for i in placed]

    def segments_for(self, run_starts: np.ndarray, run_ends: np.ndarray) -> list[Segment]:
        """The segments that tokens ``[run_starts[r], run_ends[r])`` touch, in token order."""
        if run_starts.size == 0 or not self.segments:
            return []
        if len(self.segments) == 1:
            return list(self.segments)
        starts = np.array([s.token_start for s in self.segments], dtype=np.int64)
        return [self.segments[i] for i in touched(starts, run_starts, run_ends)]

    def row_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global token start and end of each of ``rows``."""
        return self.offsets[rows], self.offsets[rows + 1]

    def all_offsets(self) -> np.ndarray:
        return self.offsets


def touched(starts: np.ndarray, run_starts: np.ndarray, run_ends: np.ndarray) -> list[int]:
    """The parts beginning at ``starts`` (ascending, non-empty) that tokens ``[run_starts[r],
    run_ends[r])`` touch, by index, ascending."""
    first = np.searchsorted(starts, run_starts, side="right") - 1
    last = np.searchsorted(starts, run_ends - 1, side="right") - 1
    return np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last, strict=True)])).tolist()


def load_contents(
    path: str,
    field: str,
    ledger: Ledger,
    old: Contents,
    *,
    context: ts.Context,
    expected: np.dtype | None,
    verify: bool = True,
    shard_ledgers: Mapping[str, Ledger] | None = None,
) -> Contents:
    """``old`` brought up to ``ledger``; only new rows and new shards are read.

    With ``verify``, each segment carries the verifier of its data chunks (``verify.py``). A part
    whose ledger says ``meshbatch_checksums: true`` (the cache's own ledger for the consolidated
    layout; for a shard ``shard_ledgers[name]``, read before its arrays) must have its checksum
    sidecar. Each segment's ``identity`` is its part's ``cache_id`` where the ledger has one.

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
    shards = dict(shard_ledgers or {})
    return _sharded(
        path, field, ledger, old, context=context, expected=expected, verify=verify, shards=shards
    )


def checked_dtype(
    found: np.dtype, expected: np.dtype | None, loaded: np.dtype | None, *, where: str
) -> np.dtype:
    """``found`` (a part's data dtype), checked against the ``expected`` one and the one loaded."""
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
    dtype = checked_dtype(
        np.dtype(arrays.data.dtype.numpy_dtype), expected, old.dtype, where=arrays.data_path
    )
    segment = Segment(
        arrays.data_path,
        0,
        int(offsets[-1]),
        arrays.data,
        path,
        verifier,
        identity=ledger.cache_id or arrays.opened,  # ``Segment.identity``
    )
    return Contents(ledger, offsets, (segment,), dtype, ("",), arrays)


def _sharded(path, field, ledger: Ledger, old: Contents, *, context, expected, verify, shards) -> Contents:
    required = {name: shard.meshbatch_checksums for name, shard in shards.items()}
    shard_ids = {name: shard.cache_id for name, shard in shards.items()}
    entries = shard_table(ledger, field, root=path)
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
        return arrays, offsets, verifier

    with ThreadPoolExecutor(max_workers=16) as pool:  # opens are I/O-latency bound
        loaded_parts = list(pool.map(load, entries[loaded:]))
    offsets, segments, dtype = [old.offsets], list(old.segments), old.dtype
    start = int(old.offsets[-1])
    for entry, (arrays, shard_offsets, verifier) in zip(entries[loaded:], loaded_parts, strict=True):
        where = posixpath.join(path, entry.name, field, "data")
        data = arrays.data
        dtype = checked_dtype(np.dtype(data.dtype.numpy_dtype), expected, dtype, where=where)
        offsets.append(shard_offsets[1:] + start)
        if entry.tokens:
            segment = Segment(
                where,
                start,
                entry.tokens,
                data,
                path,
                verifier,
                part=entry.name,
                identity=shard_ids.get(entry.name) or arrays.opened,  # ``Segment.identity``
            )
            segments.append(segment)
        start += entry.tokens
    parts = tuple(e.name for e in entries)
    return Contents(ledger, np.concatenate(offsets), tuple(segments), dtype, parts, None)


def load_part(
    root: str,
    field: str,
    *,
    rows: int,
    finished: bool,
    recorded: int | None,
    context: ts.Context,
    arrays: FieldArrays | None = None,
    loaded: np.ndarray | None = None,
    verify: bool = True,
    verified: frozenset = frozenset(),
    sidecar_required: bool = False,
) -> tuple[FieldArrays, np.ndarray, ChunkVerifier | None]:
    """Opens (or reuses) the part's arrays and loads its offsets up to ``rows``.

    Args:
        root: the part's directory.
        field: the field read.
        rows: rows the ledger commits for the part.
        finished: the part is finished (its ``offsets[0]`` must equal ``rows``).
        recorded: the ledger's token count for the part, if it records one.
        context: TensorStore context of the opens.
        arrays: the part's arrays, if already open.
        loaded: int64 offsets loaded before (normalised, starting at 0); only rows after them are read.
        verify: check the new offsets and the last data chunk against the checksum sidecar, and
            return the verifier of the part's data chunks.
        verified: chunks the previous snapshot's verifier had verified (kept where still final).
        sidecar_required: the part's ledger says ``meshbatch_checksums: true``: the part must have
            its sidecar (``check_sidecar``), with or without ``verify``.

    Returns:
        The arrays, int64 ``[rows + 1]`` offsets starting at 0, and the data chunks' verifier
        (``None`` without a sidecar or with ``verify=False``).

    Raises:
        CacheIntegrityError: see the module docstring.
    """
    arrays = arrays or open_field(root, field, context=context)
    loaded = np.zeros(1, dtype=np.int64) if loaded is None else loaded
    where = posixpath.join(arrays.root, "offsets")
    before = loaded.shape[0] - 1
    raw, last = read_ends(arrays, before, rows, finished=finished, recorded=recorded, where=where)
    if last is not None:  # rows grew: the new offsets, read once the ends are checked
        new = arrays.offsets[before + 1 : rows + 1].read()
        raw = np.concatenate([raw, read_result(new, f"offsets[{before + 1} : {rows + 1}]", where)])
    offsets = check_offsets(
        np.concatenate([raw[:1], loaded[1:], raw[1:]]), rows=rows, finished=finished, where=where
    )
    end, grew = int(offsets[-1]), rows > before
    sums = None
    if end > loaded[-1] or finished or verify:
        sums = check_part(
            arrays, end, rows=rows, finished=finished, recorded=recorded, where=where,
            sidecar_required=sidecar_required, context=context,
        )  # fmt: skip
    if not verify or sums is None:
        return arrays, offsets, None
    if grew or finished:
        verify_offsets(np.concatenate([raw[:1], offsets[1:]]), sums, first=loaded.shape[0], where=where)
    verifier = ChunkVerifier(sums, end, where=arrays.data_path, verified=verified)
    if end > loaded[-1] or finished:
        check_last_chunk(verifier, arrays.data, end, cache=root)
    return arrays, offsets, verifier


def read_ends(
    arrays: FieldArrays, loaded: int, rows: int, *, finished: bool, recorded: int | None, where: str
) -> tuple[np.ndarray, int | None]:
    """``offsets[0]`` (checked against ``rows``) and, when ``rows > loaded``, ``offsets[rows]`` (checked
    against ``recorded``): one small batch of reads."""
    if rows + 1 > arrays.offsets.domain.exclusive_max[0]:
        raise CacheIntegrityError(f"{where}: the ledger commits {rows} rows, beyond the offsets array")
    with ts.Batch() as batch:
        count = arrays.offsets[0:1].read(batch=batch)
        last = arrays.offsets[rows : rows + 1].read(batch=batch) if rows > loaded else None
    check_row_count(
        int(read_result(count, "offsets[0]", where)[0]), rows=rows, finished=finished, where=where
    )
    if last is None:
        return read_result(count, "offsets[0]", where), None
    end = int(read_result(last, f"offsets[{rows}], the end of the last row the ledger commits", where)[0])
    if recorded is not None and end != recorded:
        raise CacheIntegrityError(f"{where} reach token {end}, but the ledger records {recorded} tokens")
    return read_result(count, "offsets[0]", where), end


def read_result(future: ts.Future, what: str, where: str) -> np.ndarray:
    try:
        return future.result()
    except ValueError as e:  # TensorStore: a missing chunk (never filled) or one that does not decode
        raise CacheIntegrityError(f"{where}: cannot read {what}: {e}") from e


def check_part(arrays, end: int, *, rows, finished, recorded, where, sidecar_required, context):
    """A part's data checked against the end of its offsets (``end``) and its ledger's counts
    (the extent too once it is finished), and its checksum sidecar's sums (``None`` without one):
    the checks an eager load and a lazy open share."""
    check_data_end(end, data=arrays.data, recorded=recorded, where=where)
    if finished:
        check_extent(end, data=arrays.data, offsets=arrays.offsets, rows=rows, where=where)
    dtype = np.dtype(arrays.data.dtype.numpy_dtype)
    return check_sidecar(
        arrays.root, rows=rows, tokens=end, finished=finished, dtype=dtype, required=sidecar_required,
        context=context,
    )  # fmt: skip
