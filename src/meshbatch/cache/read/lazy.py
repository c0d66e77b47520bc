"""A finished cache opened without its document offsets, and a sharded one without its shards' arrays.

Reading tokens needs only where each data array sits in the global token space, which the ledger
gives: a consolidated cache's token count, a sharded cache's per-shard counts. So a large finished
cache is opened from its ledgers alone (``TokenCache.open``'s ``eager``)::

    open        the cache's ledger (a sharded one's per-shard rows and tokens place every shard),
                and the first part holding tokens (its dtype, checked against the one expected) or
                a consolidated cache whole; no other shard is read
    first read  of tokens in a shard: its ledger read (watched from then on, ``watch.py``), its
                arrays opened and checked (the checks of an eager open that read no bulk
                offsets), then its tokens; several shards at once concurrently
    row_spans   reads only the offsets of the rows asked for (a sidecar chunk whole, summed, the
                first time it is touched), checked (ordered, within the part's tokens) before use
    doc_offsets reads every row's offsets on its first call and keeps them

Nothing is served from a shard before its checks pass, so a damaged shard raises the same named
error an eager open raises, at the first read that touches it rather than at open. Memory after
open grows with the number of shards (a few integers each), not with the number of documents, and
its time with neither: opening 10,000 shards on an object store is a few requests.
"""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorstore as ts

from meshbatch.cache.format.arrays import FieldArrays, open_field
from meshbatch.cache.format.checks import CacheIntegrityError, check_monotone
from meshbatch.cache.format.ledger import (
    SHARDED,
    Ledger,
    check_distinct_shards,
    shard_root,
    shard_table,
)
from meshbatch.cache.format.stores import uncached
from meshbatch.cache.integrity.checksums import Checksums
from meshbatch.cache.integrity.verify import ChunkVerifier, check_last_chunk, verify_offsets_chunk
from meshbatch.cache.read.contents import Placed, check_part, checked_dtype, read_ends, read_result, touched
from meshbatch.cache.read.reads import Segment
from meshbatch.cache.read.watch import ShardFiles, read_shard_ledgers

OFFSETS_BLOCK = 1 << 16  # offsets read together where no sidecar fixes the chunk (512 KiB of int64)
OPEN_THREADS = 32  # shards opened at once (each open is a few dependent requests)


class LazyPart:
    """One opened and checked part (the cache, or one shard) whose offsets are read on request.

    Attributes:
        name: the shard's name (``""`` for a consolidated cache).
        rows, tokens: the part's committed rows and tokens.
        segment: its data array in the global token space (``None`` for a part of no tokens).
    """

    def __init__(
        self,
        name: str,
        arrays: FieldArrays,
        rows: int,
        tokens: int,
        token_start: int,
        sums: Checksums | None,
        verifier: ChunkVerifier | None,
        cache: str,
        cache_id: str | None = None,
    ):
        self.name, self.rows, self.tokens, self.token_start = name, rows, tokens, token_start
        self.dtype, self.data_path = np.dtype(arrays.data.dtype.numpy_dtype), arrays.data_path
        self._offsets = arrays.offsets
        self._sums = sums if verifier is not None else None  # offsets are summed where reads are
        self._where = posixpath.join(arrays.root, "offsets")
        self._verified: set[int] = set()
        self._lock = threading.Lock()
        self.segment = (
            Segment(
                self.data_path,
                token_start,
                tokens,
                arrays.data,
                cache,
                verifier,
                part=name,
                identity=cache_id or arrays.opened,  # ``Segment.identity``: the part's own ledger's
            )
            if tokens
            else None
        )

    def start_offsets(
        self, index: np.ndarray, *, batch: ts.Batch, whole: bool = False
    ) -> Callable[[], np.ndarray]:
        """Plans reading the part's offsets (starting at 0, local to the part) at ``index`` (ints in
        ``[0, rows]``) in ``batch``; the returned function waits, checks and answers.

        A chunk the sidecar sums and this reader has not verified yet is read whole (sidecar
        chunks), summed and checked monotone and within the part's tokens; every other offset is
        read alone (one index-array read), so a later read of a few rows reads a few offsets.
        ``whole`` reads whole blocks (``OFFSETS_BLOCK`` elements without a sidecar) throughout,
        each checked the same way: every row's offsets (``doc_offsets``).

        Raises (from the returned function):
            CacheIntegrityError: offsets that cannot be read, fail their checksum, are not monotone
                or lie outside the part's tokens.
        """
        index = np.asarray(index, dtype=np.int64)
        size = self._sums.chunk_elements if self._sums is not None else OFFSETS_BLOCK
        chunks = np.unique(index // size).tolist()
        if whole:
            full = chunks
        elif self._sums is not None:
            with self._lock:
                full = [k for k in chunks if k not in self._verified]
        else:
            full = []
        bounds = [(k * size, min((k + 1) * size, self.rows + 1)) for k in full]
        in_full = np.isin(index // size, np.array(full, dtype=np.int64))
        single = np.unique(index[~in_full])
        chunk_reads = [self._offsets[lo:hi].read(batch=batch) for lo, hi in bounds]
        single_read = self._offsets[single].read(batch=batch) if single.size else None

        def finish() -> np.ndarray:
            out = np.empty(index.shape[0], np.int64)
            order = np.argsort(index, kind="stable")
            ordered = index[order]
            for k, (lo, hi), future in zip(full, bounds, chunk_reads, strict=True):
                values = np.array(read_result(future, f"offsets[{lo} : {hi}]", self._where), dtype=np.int64)
                if self._sums is not None:
                    verify_offsets_chunk(values, k, self._sums, where=self._where)
                    with self._lock:
                        self._verified.add(k)
                if lo == 0:
                    values[0] = 0
                self._check(values, lo)
                a, b = np.searchsorted(ordered, [lo, hi])
                out[order[a:b]] = values[ordered[a:b] - lo]
            if single_read is not None:
                what = f"offsets at {single.size} rows"
                values = np.array(read_result(single_read, what, self._where), dtype=np.int64)
                values[single == 0] = 0
                beyond = np.flatnonzero((values < 0) | (values > self.tokens))
                if beyond.size:
                    self._outside(int(single[beyond[0]]), int(values[beyond[0]]))
                rest = ~in_full
                out[rest] = values[np.searchsorted(single, index[rest])]
            return out

        return finish

    def _check(self, values: np.ndarray, lo: int) -> None:
        check_monotone(values, where=self._where, first=lo)
        beyond = np.flatnonzero((values < 0) | (values > self.tokens))
        if beyond.size:
            self._outside(lo + int(beyond[0]), int(values[beyond[0]]))

    def _outside(self, i: int, value: int) -> None:
        raise CacheIntegrityError(
            f"{self._where}: offsets[{i}] = {value} lies outside the part's {self.tokens} tokens "
            "(its last offset)"
        )


class LazyContents:
    """A finished cache opened without its offsets: its parts (the cache, or its shards, each opened
    as the module docstring says) in the global row and token space."""

    def __init__(
        self,
        path: str,
        field: str,
        ledger: Ledger,
        *,
        context: ts.Context,
        expected: np.dtype | None,
        verify: bool,
        watch_shards: Callable[[ShardFiles], None],
    ):
        """``watch_shards`` is given the ledgers of the shards this reader opens, as it opens them
        (read before their arrays: a shard replaced after it was opened is noticed)."""
        self.path, self.field, self.ledger = path, field, ledger
        self._context, self._expected, self._verify = context, expected, verify
        self._watch_shards = watch_shards
        self._lock = threading.Lock()
        self._open: dict[int, LazyPart] = {}
        self._all_offsets: np.ndarray | None = None
        self.dtype: np.dtype | None = None
        if ledger.layout == SHARDED:
            entries = shard_table(ledger, field, root=path)
            check_distinct_shards(path, [e.name for e in entries])
            self.parts = tuple(e.name for e in entries)
            rows = np.array([e.rows for e in entries], dtype=np.int64)
            tokens = np.array([e.tokens for e in entries], dtype=np.int64)
            self._recorded = tokens
        else:
            self.parts = ("",)
            rows = np.array([ledger.total_num_rows], dtype=np.int64)
            recorded = ledger.field_counts.get(field)
            self._recorded = None if recorded is None else np.array([recorded], np.int64)
            tokens = None
        self.row_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        if tokens is None:  # consolidated: the token count is the part's last offset
            part = self._open_parts([0])[0]
            tokens = np.array([part.tokens], dtype=np.int64)
        self.token_starts = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int64)
        self._filled = np.flatnonzero(tokens > 0)  # parts holding tokens, in token order
        if self.dtype is None and self._filled.size:
            self._open_parts([int(self._filled[0])])

    @property
    def num_rows(self) -> int:
        return int(self.row_starts[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.token_starts[-1])

    def _open_parts(self, indices) -> list[LazyPart]:
        """The parts at ``indices``, opening (concurrently) and checking those not open yet."""
        with self._lock:
            missing = [i for i in dict.fromkeys(indices) if i not in self._open]
        named = [self.parts[i] for i in missing if self.parts[i]]
        ledgers = read_shard_ledgers(self.path, named, self._context)  # one round, before the arrays
        self._watch_shards(ledgers)

        def one(i: int) -> LazyPart:
            ledger = ledgers[self.parts[i]][1] if self.parts[i] else self.ledger  # the part's own
            return self._open_part(i, sidecar_required=ledger.meshbatch_checksums, cache_id=ledger.cache_id)

        if len(missing) > 1:
            with ThreadPoolExecutor(max_workers=min(OPEN_THREADS, len(missing))) as pool:
                opened = list(pool.map(one, missing))
        else:
            opened = [one(i) for i in missing]
        with self._lock:
            for part in opened:  # every part agrees with the first (and ``expected``) before any is kept
                self.dtype = checked_dtype(part.dtype, self._expected, self.dtype, where=part.data_path)
            for i, part in zip(missing, opened, strict=True):
                self._open.setdefault(i, part)
            return [self._open[i] for i in indices]

    def _open_part(self, i: int, *, sidecar_required: bool, cache_id: str | None = None) -> LazyPart:
        """Opens part ``i`` and runs every check of ``contents.load_part`` that reads no bulk offsets.

        Reads ``offsets[0]`` and ``offsets[rows]`` (checked against the ledger), the data chunk
        holding the last token and what lies past it, and the checksum sidecar; with verification,
        the last data chunk is summed. The offsets themselves are read (and checked: monotone,
        within the data, against the sidecar) where they are asked for (``LazyPart.start_offsets``).

        Raises:
            CacheIntegrityError: see ``contents.py``'s module docstring.
        """
        name, rows = self.parts[i], int(self.row_starts[i + 1] - self.row_starts[i])
        recorded = None if self._recorded is None else int(self._recorded[i])
        root = shard_root(self.path, name) if name else self.path
        # its offsets chunks are read a few at a time, never kept
        arrays = open_field(root, self.field, context=self._context, offsets_context=uncached(self._context))
        where = posixpath.join(arrays.root, "offsets")
        _, end = read_ends(arrays, -1, rows, finished=True, recorded=recorded, where=where)
        sums = check_part(
            arrays, end, rows=rows, finished=True, recorded=recorded, where=where,
            sidecar_required=sidecar_required, context=self._context,
        )  # fmt: skip
        verifier = None
        if self._verify and sums is not None:
            verifier = ChunkVerifier(sums, end, where=arrays.data_path)
            check_last_chunk(verifier, arrays.data, end, cache=root)
        token_start = int(self.token_starts[i]) if name else 0  # consolidated: opened before token_starts
        return LazyPart(name, arrays, rows, end, token_start, sums, verifier, self.path, cache_id)

    def placed(self) -> Placed:
        """Every part holding tokens, placed in the token space; a part not opened yet has no
        segment (``open_segments`` opens it)."""
        with self._lock:
            opened = dict(self._open)
        filled = self._filled.tolist()
        return Placed(
            self.token_starts[self._filled],
            self.token_starts[self._filled + 1],
            [opened[i].segment if i in opened else None for i in filled],
        )

    def open_segments(self, placed: list[int]) -> list[Segment]:
        """The segments of the parts at ``placed`` (their places in ``placed()``), opening (in one
        round, checked) those not open yet."""
        return [part.segment for part in self._open_parts(self._filled[placed].tolist())]

    def segments_for(self, run_starts: np.ndarray, run_ends: np.ndarray) -> list[Segment]:
        """The segments of every part that tokens ``[run_starts[r], run_ends[r])`` touch, in token
        order, opening the parts not open yet."""
        if run_starts.size == 0 or self._filled.size == 0:
            return []
        indices = touched(self.token_starts[self._filled], run_starts, run_ends)
        parts = self._open_parts(self._filled[indices].tolist())
        return [part.segment for part in parts]

    def row_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global token start and end of each of ``rows`` (checked in range by the caller)."""
        rows = np.asarray(rows, dtype=np.int64)
        part = np.searchsorted(self.row_starts, rows, side="right") - 1
        starts, ends = np.empty(rows.shape[0], np.int64), np.empty(rows.shape[0], np.int64)
        touched = np.unique(part).tolist()
        pending = []
        with ts.Batch() as batch:  # the offsets of every shard touched: one round of reads
            for p, opened in zip(touched, self._open_parts(touched), strict=True):  # opened together
                mask = part == p
                local = rows[mask] - self.row_starts[p]
                pending.append(
                    (p, mask, opened.start_offsets(np.concatenate([local, local + 1]), batch=batch))
                )
        for p, mask, finish in pending:
            got = finish()
            n = got.shape[0] // 2
            starts[mask] = got[:n] + self.token_starts[p]
            ends[mask] = got[n:] + self.token_starts[p]
        bad = np.flatnonzero(ends < starts)
        if bad.size:
            i = int(bad[0])
            p = int(part[i])
            raise CacheIntegrityError(
                f"{posixpath.join(self.path, self.parts[p], self.field, 'offsets')} not monotone: row "
                f"{int(rows[i] - self.row_starts[p])} spans [{int(starts[i] - self.token_starts[p])}, "
                f"{int(ends[i] - self.token_starts[p])})"
            )
        return starts, ends

    def all_offsets(self) -> np.ndarray:
        """int64 ``[num_rows + 1]`` global offsets, read on the first call and kept."""
        with self._lock:
            if self._all_offsets is not None:
                return self._all_offsets
        parts = self._open_parts(list(range(len(self.parts))))
        with ts.Batch() as batch:
            pending = [
                (i, part.start_offsets(np.arange(1, part.rows + 1), batch=batch, whole=True))
                for i, part in enumerate(parts)
                if part.rows
            ]
        pieces = [np.zeros(1, np.int64)] + [finish() + self.token_starts[i] for i, finish in pending]
        offsets = np.concatenate(pieces)
        with self._lock:
            self._all_offsets = offsets
        return offsets
