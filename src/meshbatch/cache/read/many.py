"""One read plan for the spans of many caches: the caches a dataset reads as one token space.

A step of a mixture reads a few spans from each of many caches. Planned cache by cache
(``TokenCache.prepare_read``), every touched cache costs its own bounds check, coalesce, read plan
and counters on the host. A ``ReadSpace`` places its caches end to end in one virtual token space,
each shifted by a base one token past the previous cache's end (so no run joins two caches), as a
sharded cache's shards are segments of one space, and checks, coalesces and plans every span of a
step once::

    caches a (10 tokens), b (6 tokens); spans (a, 8, 2), (b, 0, 3), (a, 0, 4)
    bases a: 0, b: 11             virtual spans [8, 10), [11, 14), [0, 4)
    runs [0, 4), [8, 10), [11, 14) -> out[at:] = a[0:4] a[8:10] b[0:3]; span_starts at + [4, 6, 0]

What a step's plan needs of each cache (its token count, base and dtype, and where each of its
parts lies, with its data array once open) is kept across steps in arrays, one table of parts for
caches alike in block cache (and, with one, in dtype): a step's work grows with the spans and parts
it reads, not with the caches it touches. The table is rebuilt when any reader loads rows
(``reader.load_count``: a cache still being written grew); a lazily opened cache's parts are
opened as a step first touches them.

What lands in ``out``, each span's place, each cache's counters and the errors are those of one
``prepare_read`` per touched cache, in cache order. The ledger of each cache the plan reads from
storage (and the ledgers of the shards it reads) is checked once per read, as ``prepare_read``
checks it; ``Segment``s keep their own cache's offsets, so a failed read or checksum names that
cache and its tokens. Caches that cannot share
the plan (a dtype that does not widen into ``out``, a second reader at the same path) are planned
one by one from the shared coalesce, exactly as ``prepare_read`` plans them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshbatch.cache.format.checks import as_index_array, check_out_buffer
from meshbatch.cache.read.coalesce import Coalesced, ReadCounters, SourceRuns, as_spans, coalesce_sources
from meshbatch.cache.read.reader import TokenCache, check_fits, load_count
from meshbatch.cache.read.reads import PendingRead, pieces, plan_pieces, widens_exactly
from meshbatch.cache.read.watch import LedgerWatch, start_watches


@dataclass(frozen=True)
class ManyRead:
    """The planned reads of ``ReadSpace.prepare``.

    Attributes:
        reads: the ``PendingRead``s to hand to ``run_reads`` (with other reads, if any).
        span_starts: int64 ``[n]``, where each requested span will begin in ``out``.
        end: the position in ``out`` just past the last cache's tokens.
    """

    reads: list[PendingRead]
    span_starts: np.ndarray
    end: int


def prepare_reads(
    caches: Sequence[TokenCache], source, starts, lengths, out: np.ndarray, at: int
) -> ManyRead:
    """Plans reading spans of several caches, coalesced, into ``out[at:]``, as one plan: a
    ``ReadSpace`` used once (keep one across steps to keep what it learns of the caches)."""
    return ReadSpace(caches).prepare(source, starts, lengths, out, at)


class ReadSpace:
    """Caches read together, step after step, as one token space (module docstring).

    Args:
        caches: the caches ``prepare``'s ``source`` indexes (a reader may be listed twice).

    Raises:
        TypeError: an entry that is not a ``TokenCache``.
    """

    def __init__(self, caches: Sequence[TokenCache]):
        for i, cache in enumerate(caches):
            if not isinstance(cache, TokenCache):
                raise TypeError(f"caches[{i}] must be a TokenCache (got {type(cache).__name__})")
        self.caches = tuple(caches)
        self._lock = threading.Lock()
        self._kept: _Kept | None = None

    def prepare(self, source, starts, lengths, out: np.ndarray, at: int) -> ManyRead:
        """Plans reading spans of the caches, coalesced, into ``out[at:]``, as one plan.

        The same as ``caches[c].prepare_read(starts[source == c], lengths[source == c], out, at_c)``
        for each cache ``c`` that ``source`` names, in ascending ``c``, each placed where the
        previous one ends; planned once for all of them (module docstring).

        Args:
            source: int ``[n]``, each span's cache.
            starts: int ``[n]`` token offsets in that cache, any order, duplicates allowed.
            lengths: int ``[n]`` span lengths (or a scalar).
            out: the destination buffer; ``out`` may be int32 whatever the caches' dtypes (see
                ``prepare_read``).
            at: where in ``out`` the first cache's tokens begin.

        Raises:
            IndexError: a ``source`` out of range; a span past its cache's end (naming that cache).
            TypeError, ValueError: as ``prepare_read``.
        """
        caches = self.caches
        check_out_buffer("out", out, at=at)
        source = as_index_array("source", source)
        bad = source[(source < 0) | (source >= len(caches))]
        if bad.size:
            raise IndexError(f"source {int(bad[0])} out of range for {len(caches)} caches")
        try:
            checked = as_spans(starts, lengths)
        except ValueError:  # a negative span: named as the cache's own read names it
            _raise_first(caches, source, starts, lengths, out, at)
            raise
        starts, lengths = checked
        if source.shape != starts.shape:
            raise ValueError(
                f"source and starts must be of equal length (got {source.shape=}, {starts.shape=})"
            )
        kept = self._keep(out.dtype)
        ends = starts + lengths
        if ends.size and (ends > kept.num_tokens[source]).any():
            _raise_first(caches, source, starts, lengths, out, at)
            raise AssertionError("a span past its cache's end that the cache's own read did not refuse")
        spans = coalesce_sources(starts + kept.bases[source], lengths, source, len(caches))
        total = int(spans.run_offsets[-1])
        if at + total > out.shape[0]:
            _raise_first(caches, source, starts, lengths, out, at)
            raise AssertionError(f"{total} tokens at {at} do not fit out, yet each cache's did")
        span_starts = at + spans.span_starts
        empty = lengths == 0  # an empty span points where its cache's tokens begin, as prepare_read's
        span_starts[empty] = at + spans.run_offsets[spans.first_run[source[empty]]]

        touched = np.flatnonzero(spans.requested)
        groups = kept.group_of[touched]  # the groups this step touches, not every group
        reads = []
        for g in np.unique(groups[groups >= 0]).tolist():
            members = touched[groups == g]
            group = kept.groups[g]
            reads.append(group.plan(caches, kept.watches, members, spans, source, span_starts, out, at))
        for j in touched[groups < 0].tolist():  # planned as its own ``prepare_read`` plans it
            a, b = int(spans.first_run[j]), int(spans.first_run[j + 1])
            offsets = spans.run_offsets[a : b + 1]
            begin = int(offsets[0])
            runs = Coalesced(
                spans.run_starts[a:b] - kept.bases[j],
                spans.run_lengths[a:b],
                offsets - begin,
                span_starts[source == j] - at - begin,
                int(spans.unique[j]),
            )
            reads.append(caches[j]._prepare_coalesced(runs, int(spans.requested[j]), out, at + begin))
        return ManyRead(reads, span_starts, at + total)

    def _keep(self, out_dtype: np.dtype) -> _Kept:
        """What planning needs of the caches, kept since no reader has loaded rows."""
        kept = self._kept
        if kept is not None and kept.loads == load_count() and kept.out_dtype == out_dtype:
            return kept
        with self._lock:
            loads = load_count()  # before the caches are looked at: a later load is seen next time
            kept = self._kept
            if kept is None or kept.loads != loads or kept.out_dtype != out_dtype:
                kept = self._kept = _Kept.of(self.caches, out_dtype, loads)
            return kept


@dataclass(frozen=True)
class _Kept:
    """What ``ReadSpace`` keeps of its caches: their token counts and bases, and their parts."""

    loads: int
    out_dtype: np.dtype
    num_tokens: np.ndarray  # int64 [n]
    bases: np.ndarray  # int64 [n] each cache's place in the virtual space
    groups: list[_Group]  # caches that share a plan
    group_of: np.ndarray  # int [n] each cache's group; -1: planned on its own
    watches: list[LedgerWatch | None]

    @classmethod
    def of(cls, caches: tuple[TokenCache, ...], out_dtype: np.dtype, loads: int) -> _Kept:
        num_tokens = np.array([cache.num_tokens for cache in caches], dtype=np.int64)
        bases = np.zeros(len(caches), np.int64)
        np.cumsum(num_tokens[:-1] + 1, out=bases[1:])
        group_of = np.full(len(caches), -1, np.int64)
        groups: dict[tuple, int] = {}  # alike in block cache (and, with one, dtype): one plan
        paths, widens = set(), {}
        for j, cache in enumerate(caches):
            key, dtype = (cache.path, cache.field), cache.dtype
            fits = widens.get(dtype)
            if fits is None:
                fits = widens[dtype] = widens_exactly(dtype, out_dtype)
            if key in paths or not fits:
                continue
            paths.add(key)
            block_cache = cache.block_cache
            alike = (id(block_cache), None if block_cache is None else dtype)
            group_of[j] = groups.setdefault(alike, len(groups))
        return cls(
            loads,
            out_dtype,
            num_tokens,
            bases,
            [_Group(caches, np.flatnonzero(group_of == g).tolist(), bases) for g in range(len(groups))],
            group_of,
            [cache._watch for cache in caches],
        )


class _Group:
    """The parts of caches alike in block cache (and, with one, dtype), placed in the virtual
    space: one table, looked up with a ``searchsorted`` per step."""

    def __init__(self, caches: tuple[TokenCache, ...], members: list[int], bases: np.ndarray):
        self.member = np.zeros(len(caches), bool)
        self.member[members] = True
        self.block_cache = caches[members[0]].block_cache
        starts, ends, owners, local = [], [], [], []
        self.segments: list = []
        for j in members:
            placed = caches[j].placed()
            starts.append(placed.starts + bases[j])
            ends.append(placed.ends + bases[j])
            owners.append(np.full(len(placed.segments), j, np.int64))
            local.append(np.arange(len(placed.segments)))
            self.segments += placed.segments
        self.starts = np.concatenate(starts)  # ascending: bases ascend, each cache's parts do
        self.ends = np.concatenate(ends)
        self.cache_of = np.concatenate(owners)
        self.local = np.concatenate(local)  # each part's place among its cache's parts
        self.opened = np.array([seg is not None for seg in self.segments], bool)
        self.closed = int((~self.opened).sum())  # parts not opened yet (a lazily opened cache's)
        pairs = zip(self.segments, self.cache_of.tolist(), strict=True)
        self.owner = {id(seg): j for seg, j in pairs if seg is not None}  # each segment's cache
        self._lock = threading.Lock()

    def plan(
        self,
        caches: tuple[TokenCache, ...],
        watches: list[LedgerWatch | None],
        members: np.ndarray,
        spans: SourceRuns,
        source: np.ndarray,
        span_starts: np.ndarray,
        out: np.ndarray,
        at: int,
    ) -> PendingRead:
        """One plan for the runs of ``members`` (the group's caches this step touches)."""
        runs = np.flatnonzero(self.member[spans.run_slot])
        run_starts = spans.run_starts[runs]
        run_ends = run_starts + spans.run_lengths[runs]
        if runs.size and self.closed:
            first = np.searchsorted(self.starts, run_starts, side="right") - 1
            last = np.searchsorted(self.starts, run_ends - 1, side="right") - 1
            count = last - first + 1
            parts = np.unique(np.repeat(last, count) - _within(count))  # every part a run touches
            closed = parts[~self.opened[parts]]
            if closed.size:
                self._open(caches, closed)
        planned = pieces(
            self.segments, self.starts, run_starts, run_ends, at + spans.run_offsets[runs], self.ends
        )
        targets, extra, finish, _ = plan_pieces(planned, out, block_cache=self.block_cache)

        owner = self.owner
        touched = members.tolist()
        reads, nbytes = dict.fromkeys(touched, 0), dict.fromkeys(touched, 0)
        shards: dict[int, set[str]] = {}  # the shards each cache's reads go to storage in
        for target in targets + extra:
            seg = target.segment
            j = owner[id(seg)]
            reads[j] += 1
            if seg.part:
                shards.setdefault(j, set()).add(seg.part)
        first_run = spans.first_run
        if self.block_cache is None:  # exact reads: the runs' tokens, in each cache's dtype
            offsets = spans.run_offsets
            tokens = (offsets[first_run[members + 1]] - offsets[first_run[members]]).tolist()
            for j, n in zip(touched, tokens, strict=True):
                nbytes[j] = n * caches[j].dtype.itemsize
        else:
            for target in targets:
                nbytes[owner[id(target.segment)]] += target.dest.nbytes
        counts = zip(
            spans.requested[members].tolist(),
            spans.unique[members].tolist(),
            (first_run[members + 1] - first_run[members]).tolist(),
            reads.values(),
            nbytes.values(),
            strict=True,
        )
        ReadCounters.add_each([caches[j].counters for j in touched], counts)

        # the caches this plan reads from storage (with those shards) are checked after the reads
        # (``TokenCache._plan``); tokens served whole from the block cache are not read now
        watched = [(watches[j], shards.get(j, ())) for j in touched if reads[j] and watches[j] is not None]
        return PendingRead(
            span_starts[self.member[source]],
            at + int(spans.run_offsets[first_run[touched[-1] + 1]]),
            targets + extra,
            finish,
            functools.partial(start_watches, watched) if watched else None,
            publish=getattr(finish, "publish", None),
            abort=getattr(finish, "abort", None),
        )

    def _open(self, caches: tuple[TokenCache, ...], closed: np.ndarray) -> None:
        """Opens the parts at ``closed`` (places in the table), cache by cache, and keeps them."""
        owners = self.cache_of[closed]
        for j in np.unique(owners).tolist():
            mine = closed[owners == j]
            opened = caches[j].open_segments(self.local[mine].tolist())
            with self._lock:
                for p, seg in zip(mine.tolist(), opened, strict=True):
                    if not self.opened[p]:  # another thread may have opened it meanwhile
                        self.segments[p] = seg
                        self.owner[id(seg)] = j
                        self.opened[p] = True
                        self.closed -= 1


def _within(count: np.ndarray) -> np.ndarray:
    """For runs of ``count`` items each, each item's distance from its run's last: ``[2, 1, 0, 0]``
    for counts ``[3, 1]``."""
    ends = np.cumsum(count)
    return np.repeat(ends, count) - 1 - np.arange(int(ends[-1]) if ends.size else 0)


def _raise_first(caches, source, starts, lengths, out, at) -> None:
    """Raises the first error the caches' own reads, one after another, would raise (the messages
    name each cache and each span by its place among that cache's spans); returns if none would
    (or the arrays cannot be split by cache)."""
    starts = np.asarray(starts)
    lengths = (
        np.broadcast_to(np.asarray(lengths), starts.shape) if np.ndim(lengths) == 0 else np.asarray(lengths)
    )
    if starts.shape != source.shape or lengths.shape != source.shape:
        return
    for c in np.unique(source).tolist():
        mine = source == c
        cache = caches[c]
        runs = cache._coalesce(*as_spans(starts[mine], lengths[mine]))
        total = int(runs.run_offsets[-1])
        check_fits(out, at, total)
        at += total
