"""One read plan for the spans of many caches: the caches a step touches as one token space.

A step of a mixture reads a few spans from each of many caches. Planned cache by cache
(``TokenCache.prepare_read``), every touched cache costs its own bounds check, coalesce, read plan
and counters on the host. ``prepare_reads`` places the touched caches end to end in one virtual
token space, each shifted by a base one token past the previous cache's end (so no run joins two
caches), as a sharded cache's shards are segments of one space, and checks, coalesces and plans
every span once::

    caches a (10 tokens), b (6 tokens); spans (a, 8, 2), (b, 0, 3), (a, 0, 4)
    bases a: 0, b: 11             virtual spans [8, 10), [11, 14), [0, 4)
    runs [0, 4), [8, 10), [11, 14) -> out[at:] = a[0:4] a[8:10] b[0:3]; span_starts at + [4, 6, 0]

What lands in ``out``, each span's place, each cache's counters and the errors are those of one
``prepare_read`` per touched cache, in cache order. Each cache's ledger (and the ledgers of the
shards the read touches) is still checked once per read; ``Segment``s keep their own cache's
offsets, so a failed read or checksum names that cache and its tokens. Caches that cannot share
the plan (a dtype that does not widen into ``out``, a second cache at the same path) are planned
one by one from the shared coalesce, exactly as ``prepare_read`` plans them; caches alike in
block cache (and, with one, in dtype) share one plan.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshbatch.cache.format.checks import as_index_array, check_out_buffer
from meshbatch.cache.read.coalesce import Coalesced, SourceRuns, as_spans, coalesce_sources
from meshbatch.cache.read.contents import Contents
from meshbatch.cache.read.reader import TokenCache, check_fits
from meshbatch.cache.read.reads import PendingRead, Segment, pieces, plan_pieces, widens_exactly
from meshbatch.cache.read.watch import start_watches


@dataclass(frozen=True)
class ManyRead:
    """The planned reads of ``prepare_reads``.

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
    """Plans reading spans of several caches, coalesced, into ``out[at:]``, as one plan.

    The same as ``caches[c].prepare_read(starts[source == c], lengths[source == c], out, at_c)``
    for each cache ``c`` that ``source`` names, in ascending ``c``, each placed where the previous
    one ends; planned once for all of them (module docstring).

    Args:
        caches: the caches ``source`` indexes.
        source: int ``[n]``, each span's cache.
        starts: int ``[n]`` token offsets in that cache, any order, duplicates allowed.
        lengths: int ``[n]`` span lengths (or a scalar).
        out: the destination buffer; ``out`` may be int32 whatever the caches' dtypes (see
            ``prepare_read``).
        at: where in ``out`` the first cache's tokens begin.

    Raises:
        TypeError: a cache that is not a ``TokenCache``; as ``prepare_read``.
        IndexError: a ``source`` out of range; a span past its cache's end (naming that cache).
        ValueError: as ``prepare_read``.
    """
    check_out_buffer("out", out, at=at)
    source = as_index_array("source", source)
    for i, cache in enumerate(caches):
        if not isinstance(cache, TokenCache):
            raise TypeError(f"caches[{i}] must be a TokenCache (got {type(cache).__name__})")
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
        raise ValueError(f"source and starts must be of equal length (got {source.shape=}, {starts.shape=})")
    touched = np.unique(source)
    slot = np.searchsorted(touched, source)  # each span's place among the touched caches
    chosen = [caches[c] for c in touched.tolist()]
    num_tokens = np.array([cache.num_tokens for cache in chosen], dtype=np.int64)
    ends = starts + lengths
    if ends.size and (ends > num_tokens[slot]).any():
        _raise_first(caches, source, starts, lengths, out, at)
        raise AssertionError("a span past its cache's end that the cache's own read did not refuse")
    bases = np.zeros(len(chosen), np.int64)
    np.cumsum(num_tokens[:-1] + 1, out=bases[1:])
    spans = coalesce_sources(starts + bases[slot], lengths, slot, len(chosen))
    total = int(spans.run_offsets[-1])
    if at + total > out.shape[0]:
        _raise_first(caches, source, starts, lengths, out, at)
        raise AssertionError(f"{total} tokens at {at} do not fit out, yet each cache's did")
    span_starts = at + spans.span_starts
    empty = lengths == 0  # an empty span points where its cache's tokens begin, as prepare_read's
    span_starts[empty] = at + spans.run_offsets[spans.first_run[slot[empty]]]

    groups: dict[tuple, list[int]] = {}
    alone, paths, widens = [], set(), {}
    for j, cache in enumerate(chosen):
        key, dtype = (cache.path, cache.field), cache.dtype
        fits = widens.get(dtype)
        if fits is None:
            fits = widens[dtype] = widens_exactly(dtype, out.dtype)
        if key in paths or not fits:
            alone.append(j)
            continue
        paths.add(key)
        block_cache = cache.block_cache
        groups.setdefault((id(block_cache), None if block_cache is None else dtype), []).append(j)
    reads = [
        _plan_group(chosen, members, spans, bases, slot, span_starts, out, at) for members in groups.values()
    ]
    for j in alone:  # planned as its own ``prepare_read`` plans them, from the shared coalesce
        a, b = int(spans.first_run[j]), int(spans.first_run[j + 1])
        offsets = spans.run_offsets[a : b + 1]
        begin = int(offsets[0])
        runs = Coalesced(
            spans.run_starts[a:b] - bases[j],
            spans.run_lengths[a:b],
            offsets - begin,
            span_starts[slot == j] - at - begin,
            int(spans.unique[j]),
        )
        reads.append(chosen[j]._prepare_coalesced(runs, int(spans.requested[j]), out, at + begin))
    return ManyRead(reads, span_starts, at + total)


def _plan_group(
    chosen: list[TokenCache],
    members: list[int],
    spans: SourceRuns,
    bases: np.ndarray,
    slot: np.ndarray,
    span_starts: np.ndarray,
    out: np.ndarray,
    at: int,
) -> PendingRead:
    """One plan for the runs of ``members`` (caches alike in block cache and, with one, dtype)."""
    first, base = spans.first_run.tolist(), bases.tolist()
    segments: list[Segment] = []
    segment_starts, segment_slots, watched = [], [], []
    for j in members:
        a, b = first[j], first[j + 1]
        cache = chosen[j]
        view = cache._view
        if a == b:
            mine = ()
        elif type(view) is Contents and len(view.segments) == 1:  # a consolidated cache, loaded
            mine = view.segments
        else:
            local = spans.run_starts[a:b] - base[j]
            mine = view.segments_for(local, local + spans.run_lengths[a:b])
        for seg in mine:
            segments.append(seg)
            segment_starts.append(base[j] + seg.token_start)
            segment_slots.append(j)
        if cache._watch is not None:  # the shards this read touches are checked too
            watched.append((cache._watch, frozenset(seg.part for seg in mine if seg.part)))
    in_group = np.zeros(len(chosen), dtype=bool)
    in_group[members] = True
    runs = np.flatnonzero(in_group[spans.run_slot])
    run_starts = spans.run_starts[runs]
    planned = pieces(
        segments,
        np.array(segment_starts, np.int64),
        run_starts,
        run_starts + spans.run_lengths[runs],
        at + spans.run_offsets[runs],
    )
    lead = chosen[members[0]]
    targets, extra, finish, _ = plan_pieces(planned, out, block_cache=lead.block_cache)

    owner = {id(seg): j for seg, j in zip(segments, segment_slots, strict=True)}
    reads = dict.fromkeys(members, 0)
    nbytes = dict.fromkeys(members, 0)
    for target in targets + extra:
        reads[owner[id(target.segment)]] += 1
    if lead.block_cache is None:  # exact reads: the runs' tokens, in each cache's dtype
        tokens = np.diff(spans.run_offsets[spans.first_run]).tolist()
        for j in members:
            nbytes[j] = tokens[j] * chosen[j].dtype.itemsize
    else:
        for target in targets:
            nbytes[owner[id(target.segment)]] += target.dest.nbytes
    requested, unique = spans.requested.tolist(), spans.unique.tolist()
    for j in members:
        chosen[j].counters.add(
            spans_requested=requested[j],
            unique_spans=unique[j],
            runs=first[j + 1] - first[j],
            reads_issued=reads[j],
            bytes_read=nbytes[j],
        )
    return PendingRead(
        span_starts[in_group[slot]],
        at + int(spans.run_offsets[first[members[-1] + 1]]),
        targets + extra,
        finish,
        functools.partial(start_watches, watched) if watched else None,
        publish=getattr(finish, "publish", None),
        abort=getattr(finish, "abort", None),
    )


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
