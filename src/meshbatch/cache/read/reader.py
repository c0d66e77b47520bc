"""``TokenCache``: a Levanter token cache opened read-only, as one flat token space.

Rows (documents) are known from offsets alone; tokens are read only for requested spans. Spans are
global token offsets, so they may cross rows and, in the sharded layout, shards::

    cache = TokenCache.open("/data/cache", field="input_ids")
    cache.doc_lengths()                       # [num_rows] int64, no token read
    got = cache.read_spans([8192, 0], [4096, 4096])
    got[0], got[1]                            # tokens 8192..12287 and 0..4095, on-disk dtype
    cache.counters.as_dict()                  # {'spans_requested': 2, 'runs': 2, 'reads_issued': 2, ...}

Quick start: ``open(..., require_finished=False)`` reads a cache still being written; it sees the rows
its ledger commits, and ``refresh()`` / ``wait_for_rows(n)`` pick up rows committed since.

What a reader returns is what its writer committed, or an error: a missing or undecodable chunk, or
one that fails the checksum its writer recorded (``verify.py``), is a ``CacheIntegrityError`` naming
the cache, array and token range (never zeros or other tokens), and a cache replaced
or rewritten under the reader is a ``CacheChangedError`` on the next read (see ``watch.py``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import numpy as np
import tensorstore as ts

from meshbatch.arguments import check_bool, check_float, check_int
from meshbatch.cache.format.checks import (
    as_index_array,
    as_token_dtype,
    check_component,
    check_out_buffer,
    check_path,
)
from meshbatch.cache.format.ledger import CONSOLIDATED, SHARDED, Ledger, LedgerFile
from meshbatch.cache.format.stores import shared_context
from meshbatch.cache.integrity.verify import verify_default
from meshbatch.cache.read.coalesce import (
    Coalesced,
    ReadCounters,
    RunRead,
    SpanRead,
    as_spans,
    coalesce_spans,
)
from meshbatch.cache.read.contents import Contents, Placed, load_contents
from meshbatch.cache.read.lazy import LazyContents
from meshbatch.cache.read.lru import BlockCache
from meshbatch.cache.read.reads import (
    PendingRead,
    Segment,
    checked_cast,
    pieces,
    plan_pieces,
    run_reads,
    widens_exactly,
)
from meshbatch.cache.read.watch import LedgerWatch, ShardFiles, shard_ledgers

logger = logging.getLogger(__name__)

EAGER_MAX_SHARDS = 64  # ``eager=None``: a finished cache of at most this many shards ...
EAGER_MAX_ROWS = 1 << 16  # ... and at most this many rows is loaded and checked whole at open


def check_fits(out: np.ndarray, at: int, total: int) -> None:
    """Raise ``ValueError`` unless ``total`` tokens fit ``out`` from ``at``."""
    if at + total > out.shape[0]:
        raise ValueError(f"out has {out.shape[0]} elements; {total} tokens at {at} do not fit")


_LOADS_LOCK = threading.Lock()
_loads = 0


def load_count() -> int:
    """How many times any reader has loaded rows (``many.ReadSpace`` rebuilds what it keeps when
    this moves)."""
    return _loads


class TokenCache:
    """One field of a Levanter token cache (consolidated or sharded layout), read-only."""

    def __init__(self, path: str, field: str, *, block_cache: BlockCache | None, context: ts.Context):
        """Use ``TokenCache.open``."""
        self.path, self.field = path, field
        self.block_cache = block_cache
        self.counters = ReadCounters()
        self._context = context
        self._contents = Contents()
        self._lazy: LazyContents | None = None
        self._expected_dtype: np.dtype | None = None
        self._watch: LedgerWatch | None = None
        self.verify = True

    @classmethod
    def open(
        cls,
        path: str,
        field: str = "input_ids",
        *,
        require_finished: bool = True,
        dtype: np.dtype | str | None = None,
        block_cache: BlockCache | None = None,
        context: ts.Context | None = None,
        verify: bool | None = None,
        eager: bool | None = None,
    ) -> TokenCache:
        """Opens and validates the cache at ``path`` (a local path or TensorStore URL).

        Args:
            path: cache root (the directory holding ``shard_ledger.json``).
            field: the jagged field to read: one path component (``check_component``), as writers take it.
            require_finished: reject a cache whose ledger is not finished; pass False to read the
                committed rows of a cache under construction (quick start).
            dtype: if given, the on-disk token dtype must equal it.
            block_cache: serve reads through this LRU of decoded blocks.
            context: TensorStore context; defaults to the process-wide shared one.
            verify: check what is read against the writer's checksum sidecar (``verify.py``):
                the offsets and the last data chunk at open, each data chunk on its first read.
                ``None``: on unless the environment sets ``MESHBATCH_VERIFY_READS=0``.
            eager: load every document offset and open and check every shard at open (True), or
                open a finished cache from its ledger alone (False; ``lazy.py``: every check runs
                either way, a damaged shard's error coming at the first read that touches it).
                ``None``: eager for a cache still being written, and for a finished one of at
                most ``EAGER_MAX_SHARDS`` shards and ``EAGER_MAX_ROWS`` rows; lazy otherwise.

        Raises:
            TypeError, ValueError: a bad argument, named.
            FileNotFoundError: no ledger (naming ``path``), or missing zarr metadata (naming
                ``field``).
            ValueError: unfinished ledger (with ``require_finished``).
            CacheIntegrityError: inconsistent ledger, offsets not monotone or beyond the data, arrays
                not in Levanter's layout, dtype mismatch, a chunk that fails its checksum.
        """
        path = check_path("path", path)
        check_bool("require_finished", require_finished)
        if block_cache is not None and not isinstance(block_cache, BlockCache):
            raise TypeError(f"block_cache must be a BlockCache or None (got block_cache={block_cache!r})")
        if context is not None and not isinstance(context, ts.Context):
            raise TypeError(f"context must be a tensorstore.Context or None (got context={context!r})")
        cache = cls(
            path,
            check_component("field", field),
            block_cache=block_cache,
            context=context or shared_context(),
        )
        cache._expected_dtype = None if dtype is None else as_token_dtype("dtype", dtype)
        cache.verify = verify_default() if verify is None else check_bool("verify", verify)
        file = LedgerFile(path, context=cache._context)
        try:
            ledger, stamp = file.read()
        except FileNotFoundError as e:
            raise FileNotFoundError(f"path={path!r} is not a token cache: {e}") from e
        if require_finished and not ledger.is_finished:
            raise ValueError(
                f"cache at {path} is not finished (ledger is_finished=false, {ledger.total_num_rows} rows "
                "committed); pass require_finished=False to read committed rows while it is written"
            )
        if eager is not None:
            check_bool("eager", eager)
        if not ledger.is_finished:
            eager = True  # rows still land: ``refresh`` loads them incrementally
        elif eager is None:
            shard_count = len(ledger.finished_shards) if ledger.layout == SHARDED else 1
            eager = shard_count <= EAGER_MAX_SHARDS and ledger.total_num_rows <= EAGER_MAX_ROWS
        try:
            if eager:
                shards = shard_ledgers(path, ledger, cache.field, cache._context)  # before the load: watch.py
                cache._load(ledger, shards)
                cache._watch = LedgerWatch(file, ledger, stamp, shards)
            else:  # each shard's ledger is read when the shard is first opened
                cache._watch = LedgerWatch(file, ledger, stamp)
                cache._lazy = LazyContents(
                    path,
                    cache.field,
                    ledger,
                    context=cache._context,
                    expected=cache._expected_dtype,
                    verify=cache.verify,
                    watch_shards=cache._watch.add_shards,
                )
        except FileNotFoundError as e:
            raise FileNotFoundError(f"the cache at {path} has no readable field={field!r}: {e}") from e
        return cache

    @property
    def _view(self) -> Contents | LazyContents:
        return self._lazy if self._lazy is not None else self._contents

    def placed(self) -> Placed:
        """The parts holding tokens, placed in the token space (``Placed``)."""
        return self._view.placed()

    def open_segments(self, placed: list[int]) -> list[Segment]:
        """The segments of the parts at ``placed`` (their places in ``placed()``), each opened and
        checked first if it is not open yet (a lazily opened cache)."""
        return self._view.open_segments(placed)

    @property
    def is_eager(self) -> bool:
        """Whether every offset was loaded and every shard opened at open (``open``'s ``eager``)."""
        return self._lazy is None

    @property
    def num_rows(self) -> int:
        return self._view.num_rows

    @property
    def num_tokens(self) -> int:
        return self._view.num_tokens

    @property
    def dtype(self) -> np.dtype:
        """The on-disk token dtype (int32 for a cache with no rows and no data array opened)."""
        dtype = self._view.dtype
        return dtype if dtype is not None else np.dtype(np.int32)

    @property
    def is_finished(self) -> bool:
        return self._view.ledger is not None and self._view.ledger.is_finished

    @property
    def ledger(self) -> Ledger:
        """The ledger whose rows this reader has loaded."""
        return self._view.ledger

    @property
    def layout(self) -> str:
        return self._view.ledger.layout if self._view.ledger is not None else CONSOLIDATED

    @property
    def context(self) -> ts.Context:
        """The TensorStore context every read of this cache uses (shared across opens by default)."""
        return self._context

    @property
    def num_shards(self) -> int:
        return len(self._view.parts)

    def doc_offsets(self) -> np.ndarray:
        """int64 ``[num_rows + 1]`` global token offsets, starting at 0 (a read-only view).

        A cache opened lazily (``open``'s ``eager``) reads them on the first call and keeps them:
        ``row_spans`` reads only the rows it is asked for.
        """
        view = self._view.all_offsets().view()
        view.flags.writeable = False
        return view

    def doc_lengths(self) -> np.ndarray:
        """int64 ``[num_rows]`` tokens per row, from offsets alone (``doc_offsets``)."""
        return np.diff(self._view.all_offsets())

    def row_spans(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """Where rows (documents) lie in the global token space: int64 ``(starts, lengths)``.

        Reads only the offsets of ``rows`` (lazily opened caches read the chunks holding them,
        checked before use), never every row's.

        Raises:
            TypeError: rows that are not integers (floats, strings, bools).
            IndexError: a row is out of range.
            CacheIntegrityError: offsets that are damaged (see ``open``).
        """
        rows = as_index_array("rows", rows)
        bad = rows[(rows < 0) | (rows >= self.num_rows)]
        if bad.size:
            raise IndexError(f"row {int(bad[0])} out of range for cache {self.path} of {self.num_rows} rows")
        starts, ends = self._view.row_spans(rows.astype(np.int64))
        return starts, ends - starts

    def refresh(self) -> int:
        """Re-reads the ledger and loads rows committed since; returns ``num_rows``.

        Raises:
            CacheChangedError: the cache was replaced or rewritten rather than grown.
        """
        ledger, stamp = self._watch.file.read()
        if ledger != self._view.ledger:
            self._watch.raise_if_replaced(ledger)  # a lazily opened cache is finished: never grows
            shards = shard_ledgers(self.path, ledger, self.field, self._context, skip=self._watch.shard_names)
            self._watch.add_shards(shards)
            self._load(ledger, shards)
        self._watch.update(ledger, stamp)
        return self.num_rows

    def wait_for_rows(self, n: int, timeout: float | None = None) -> int:
        """Blocks until at least ``n`` rows are committed, polling the ledger; returns ``num_rows``.

        Raises:
            IndexError: the cache finished with fewer than ``n`` rows.
            TimeoutError: ``timeout`` seconds passed first.
        """
        check_int("n", n, low=0)
        if timeout is not None:
            check_float("timeout", timeout, low=0)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while self.refresh() < n:
            if self.is_finished:
                raise IndexError(f"cache at {self.path} finished with {self.num_rows} rows < {n=} requested")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"cache at {self.path} has {self.num_rows} rows < {n=} after {timeout=}s")
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(2 * delay, 1.0)
        return self.num_rows

    def read_runs(self, starts, lengths) -> RunRead:
        """Reads token spans coalesced: one read per run of overlapping or adjacent spans.

        Args:
            starts: int ``[n]`` global token offsets, any order, duplicates allowed.
            lengths: int ``[n]`` (or a scalar) span lengths.

        Returns:
            The unique runs in one buffer (on-disk dtype) and each span's place in it.

        Raises:
            TypeError: spans that are not integers (floats, strings, bools).
            ValueError: malformed or negative spans.
            IndexError: a span ends beyond ``num_tokens``.
            CacheIntegrityError, CacheChangedError: see the module docstring.
        """
        starts, lengths = as_spans(starts, lengths)
        runs = self._coalesce(starts, lengths)
        buffer = np.empty(int(runs.run_offsets[-1]), dtype=self.dtype)
        run_reads([self._plan(runs, starts.shape[0], buffer, 0)])
        return RunRead(buffer, runs.run_starts, runs.run_offsets, runs.span_starts, lengths)

    def prepare_read(self, starts, lengths, out: np.ndarray, at: int) -> PendingRead:
        """Plans reading token spans (as ``read_runs`` takes them), coalesced, into ``out[at:]``;
        ``run_reads`` issues it.

        Reads planned on several caches (or for several devices) and run together share one
        TensorStore batch. ``out`` may be int32 whatever the on-disk dtype: narrower integer
        dtypes are widened as they are decoded; wider ones are read aside and checked to fit.

        Returns:
            A ``PendingRead`` whose ``span_starts`` say where each span will lie in ``out``; the
            unique runs go to ``out[at : result.end]``.

        Raises:
            TypeError, ValueError, IndexError: as ``read_runs``; also ``out`` not a 1-D integer
                numpy array (TypeError) or too small (ValueError), ``at`` not an int >= 0.
        """
        check_out_buffer("out", out, at=at)
        starts, lengths = as_spans(starts, lengths)
        runs = self._coalesce(starts, lengths)
        check_fits(out, at, int(runs.run_offsets[-1]))
        return self._prepare_coalesced(runs, starts.shape[0], out, at)

    def _prepare_coalesced(self, runs: Coalesced, spans: int, out: np.ndarray, at: int) -> PendingRead:
        """``prepare_read`` of spans already coalesced (and checked to fit ``out``) into ``out[at:]``."""
        total = int(runs.run_offsets[-1])
        view = out[at : at + total]
        if widens_exactly(self.dtype, out.dtype):
            return self._plan(runs, spans, view, at)
        aside = np.empty(total, dtype=self.dtype)  # read aside, then checked to fit ``out``
        read = self._plan(runs, spans, aside, at)
        finish = read.finish

        def convert() -> None:
            if finish is not None:
                finish()
            view[:] = checked_cast(aside, view.dtype, where=self.path)

        read.finish = convert
        return read

    def _coalesce(self, starts: np.ndarray, lengths: np.ndarray) -> Coalesced:
        """``coalesce_spans`` of spans checked (``as_spans``) and refused (``IndexError``) where they
        reach past ``num_tokens``."""
        num_tokens, where = self.num_tokens, f"cache {self.path}"
        # starts and lengths are each checked first, so their sum cannot overflow int64
        for name, values in (("start", starts), ("length", lengths)):
            if values.size and values.max() > num_tokens:
                i = int(np.argmax(values))
                raise IndexError(f"span {i} has {name}={values[i]} > num_tokens={num_tokens} of {where}")
        ends = starts + lengths
        if ends.size and ends.max() > num_tokens:
            i = int(np.argmax(ends))
            raise IndexError(
                f"span {i} (start={starts[i]}, length={lengths[i]}) ends at token {ends[i]} "
                f"> num_tokens={num_tokens} of {where}"
            )
        return coalesce_spans(starts, lengths)

    def _plan(self, runs: Coalesced, spans: int, dest: np.ndarray, at: int) -> PendingRead:
        run_ends = runs.run_starts + np.diff(runs.run_offsets)
        segments = self._view.segments_for(runs.run_starts, run_ends)
        segment_starts = np.array([s.token_start for s in segments], dtype=np.int64)
        planned = pieces(segments, segment_starts, runs.run_starts, run_ends, runs.run_offsets[:-1])
        targets, checks, finish, nbytes = plan_pieces(planned, dest, block_cache=self.block_cache)
        targets = targets + checks  # a new list: a block cache's ``finish`` keeps the first
        self.counters.add(
            spans_requested=spans,
            unique_spans=runs.unique_spans,
            runs=runs.run_starts.shape[0],
            reads_issued=len(targets),
            bytes_read=nbytes,
        )
        check = None
        if self._watch is not None and targets:  # the ledger, and those of the shards read from storage
            read = frozenset(t.segment.part for t in targets if t.segment.part)
            check = functools.partial(self._watch.start, read)
        return PendingRead(
            runs.span_starts + at,
            at + int(runs.run_offsets[-1]),
            targets,
            finish,
            check,
            publish=getattr(finish, "publish", None),
            abort=getattr(finish, "abort", None),
        )

    def read_spans(self, starts, lengths) -> SpanRead:
        """Reads token spans (coalesced, see ``read_runs``) and returns them in request order."""
        return self.read_runs(starts, lengths).spans()

    def read_rows(self, rows) -> list[np.ndarray]:
        """Reads whole rows (documents) by index, in the order given.

        Raises:
            TypeError: rows that are not integers (floats, strings, bools).
            IndexError: a row is out of range.
        """
        starts, lengths = self.row_spans(rows)
        got = self.read_spans(starts, lengths)
        return [got[i] for i in range(len(got))]

    def __repr__(self) -> str:
        return (
            f"TokenCache({self.path!r}, field={self.field!r}, layout={self.layout!r}, rows={self.num_rows}, "
            f"tokens={self.num_tokens}, dtype={self.dtype}, finished={self.is_finished})"
        )

    def _load(self, ledger: Ledger, shards: ShardFiles) -> None:
        """Brings the loaded rows up to ``ledger`` (one snapshot swap; see ``contents.py``); ``shards``
        are the ledgers of the shards it adds (``meshbatch_checksums``: that shard needs its sidecar)."""
        self._contents = load_contents(
            self.path,
            self.field,
            ledger,
            self._contents,
            context=self._context,
            expected=self._expected_dtype,
            verify=self.verify,
            shard_ledgers={name: entry[1] for name, entry in shards.items()},
        )
        global _loads
        with _LOADS_LOCK:  # after the swap: whoever sees the new count sees the new rows
            _loads += 1
