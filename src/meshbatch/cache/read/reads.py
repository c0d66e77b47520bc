"""Fetching coalesced runs: one TensorStore read per run, all in one batch, into place.

The global token space is the concatenation of *segments*, one per data array (one for a
consolidated cache, one per non-empty shard of a sharded cache). A run that crosses a segment
boundary is read as one piece per segment::

    segments: part-0 holds tokens [0, 7), part-1 holds [7, 16)
    run (5, 4) = tokens [5, 9) -> part-0 data[5:7] and part-1 data[0:2]: 2 reads, buffer[0:2], [2:4]

Reads are planned first (``plan_pieces``: which slice of which array goes where) and issued later by
``run_reads``, so the reads of several requests (several caches, several devices' rows) share one
``ts.Batch`` with ``batch=`` on every read (a bare ``with ts.Batch():`` batches nothing). TensorStore
decodes each read straight into its place in the output buffer.
With a ``BlockCache``, reads cover whole aligned blocks instead, missing blocks that are consecutive
in a segment share one read, and cached blocks cost no read.

Nothing damaged or replaced is served: a read that fails (a chunk missing, since the arrays never
fill missing chunks, or one that does not decode) raises ``CacheIntegrityError`` naming the cache,
the array and the token range; and after the reads, each cache read checks that its ledger is the
one it loaded (one conditional read per cache per batch), raising ``CacheChangedError`` otherwise.
A store that does not answer (object-store server gone, 5xx after TensorStore's bounded retries,
no answer within ``MESHBATCH_READ_TIMEOUT_S``) raises ``StoreUnavailableError`` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tensorstore as ts

from meshbatch.cache.format.checks import CacheIntegrityError
from meshbatch.cache.format.stores import StoreUnavailableError, is_unavailable, read_timeout_s
from meshbatch.cache.integrity.verify import ChunkVerifier
from meshbatch.cache.read.lru import BlockCache, Pending


@dataclass(frozen=True)
class Segment:
    """One data array placed in the global token space.

    Attributes:
        key: the data array's path; identifies its blocks in a (possibly shared) ``BlockCache``.
        token_start: global offset of the array's first token.
        tokens: committed tokens in the array.
        data: the open array.
        cache: the root of the cache it belongs to, for messages.
        verifier: checks each data chunk on its first read against the writer's CRC-32
            (``verify.py``); ``None`` for a cache without checksums or with verification off.
        part: the shard it is (``""`` for a consolidated cache): a read checks that the shards it
            touched were not replaced (``watch.py``).
        identity: with ``key``, what names its blocks in a ``BlockCache``: the ``cache_id`` of
            the part's ledger (readers of one cache share blocks; a cache replaced since has
            another id, so a reader opened after the replacement never gets the old cache's
            blocks), else this opening of the array (``FieldArrays.opened``: readers of a cache
            without one, Levanter's, share none).
    """

    key: str
    token_start: int
    tokens: int
    data: ts.TensorStore
    cache: str = ""
    verifier: ChunkVerifier | None = None
    part: str = ""
    identity: str | int = 0


class Target(NamedTuple):
    """One TensorStore read: ``source`` (``segment.data[start : start + len(dest)]``) into ``dest``."""

    dest: np.ndarray
    source: ts.TensorStore
    segment: Segment
    start: int

    def describe(self) -> str:
        seg, end = self.segment, self.start + self.dest.shape[0]
        return (
            f"cache {seg.cache}: array {seg.key}, tokens [{self.start}, {end}) "
            f"(global tokens [{seg.token_start + self.start}, {seg.token_start + end}))"
        )


@dataclass
class PendingRead:
    """A planned read: TensorStore reads not yet issued, and what to do once they are done.

    Attributes:
        span_starts: int64 ``[m]``, where each requested span begins in the output buffer.
        end: the output buffer position just past this read's tokens.
        targets: the TensorStore reads, in any order.
        finish: called after every target is read (block-cache copies, dtype checks), or ``None``.
        check: starts checking that the cache read is unchanged and returns the function that
            completes the check (raising ``CacheChangedError``); reads of one cache share one check.
        publish: called after every target is read, before any ``finish``: hands blocks read for
            other threads to them (a block cache's shared reads), or ``None``.
        abort: called with the error when the reads fail, or ``None``.
    """

    span_starts: np.ndarray
    end: int
    targets: list[Target]
    finish: Callable[[], None] | None
    check: Callable[[], Callable[[], None]] | None = None
    publish: Callable[[], None] | None = None
    abort: Callable[[BaseException], None] | None = None


def plan_pieces(
    pieces: list[tuple[int, Segment, int, int]], dest: np.ndarray, *, block_cache: BlockCache | None = None
) -> tuple[list[Target], list[Target], Callable[[], None] | None, int]:
    """Plans reading ``pieces`` (``(position in dest, segment, local start, local end)``, as
    ``pieces`` makes them) into ``dest``; ``run_reads`` issues the reads, then ``finish``.

    The pieces may come from the segments of several caches alike in dtype. TensorStore decodes
    straight into ``dest``, converting to its dtype; with ``block_cache``, whole blocks are read
    through that LRU instead of exact ranges.

    Returns:
        ``(data reads, verification reads, finish, bytes_read)``: whole-chunk reads that verify
        chunks read for the first time are not counted in ``bytes_read``.
    """
    if not pieces:
        return [], [], None, 0
    if block_cache is None:
        targets = [Target(dest[at : at + hi - lo], seg.data[lo:hi], seg, lo) for at, seg, lo, hi in pieces]
        itemsize = np.dtype(pieces[0][1].data.dtype.numpy_dtype).itemsize
        finish, nbytes = None, sum(hi - lo for _, _, lo, hi in pieces) * itemsize
    else:
        targets, finish, nbytes = _plan_blocks(pieces, dest, block_cache)
    blocks = block_cache is not None
    checks, verify = _plan_verification(pieces, targets, blocks=blocks, waited=getattr(finish, "waited", ()))
    if verify is None:
        return targets, [], finish, nbytes
    publish = getattr(finish, "publish", None)
    if publish is not None:  # a block cache: its blocks are verified before other threads get them

        def verify_then_publish() -> None:
            verify()
            publish()

        finish.publish = verify_then_publish  # run_reads: publish, then finish; abort on any error
        return targets, checks, finish, nbytes

    def verify_then_finish() -> None:  # exact reads (no block cache): nothing to hand over
        verify()
        if finish is not None:
            finish()

    return targets, checks, verify_then_finish, nbytes


def _plan_verification(
    pieces, reads: list[Target], *, blocks: bool = False, waited: Sequence[tuple[Segment, int, int]] = ()
) -> tuple[list[Target], Callable[[], None] | None]:
    """What verifies the chunks not verified yet that ``pieces`` touch (and, for ``blocks``, that
    ``reads`` cover whole), and the extra reads it needs.

    A chunk that one of ``reads`` covers whole is summed from that read's destination (no extra
    read). With ``blocks`` (``reads`` are a block cache's), every chunk a read covers whole is
    summed, touched or not: blocks read for other threads are verified whole before they get them,
    and a chunk lying whole in a block another thread reads (``waited``: ``(segment, lo, hi)``) is
    left to that block's reader (``_plan_blocks`` checks it on arrival if its reader did not).
    Any other chunk is read whole in the same batch::

        chunk 3 = tokens [768, 1024), read [700, 1100) -> summed from that read's dest[68:324]
        chunk 4 = tokens [1024, 1280), read [1100, 1110) -> one more read of [1024, 1280)
        chunk 5 = tokens [1280, 1536), block [1280, 1536) another thread reads -> nothing here
    """
    wanted: dict[tuple, tuple[Segment, int]] = {}
    for _, seg, lo, hi in pieces:
        if seg.verifier is not None and not seg.verifier.complete:
            for k in seg.verifier.pending(lo, hi):
                wanted.setdefault((seg.key, k), (seg, k))
    for seg, lo, hi in waited:
        if seg.verifier is not None and wanted:
            for k in seg.verifier.within(lo, hi):
                wanted.pop((seg.key, k), None)
    if blocks:
        for t in reads:
            if t.segment.verifier is not None:
                for k in t.segment.verifier.pending_within(t.start, t.start + t.dest.shape[0]):
                    wanted.setdefault((t.segment.key, k), (t.segment, k))
    if not wanted:
        return [], None
    covered: dict[tuple, Target] = {}  # chunks some read covers whole: one pass over the reads
    for t in reads:
        verifier = t.segment.verifier
        if verifier is not None:
            for k in verifier.within(t.start, t.start + t.dest.shape[0]):
                if (t.segment.key, k) in wanted:
                    covered.setdefault((t.segment.key, k), t)
    sources, extra = [], []
    for key, (seg, k) in wanted.items():
        lo, hi = seg.verifier.bounds(k)
        dtype = np.dtype(seg.data.dtype.numpy_dtype)
        covering = covered.get(key)
        if covering is None:
            covering = Target(np.empty(hi - lo, dtype=dtype), seg.data[lo:hi], seg, lo)
            extra.append(covering)
        sources.append((seg, k, covering, lo - covering.start, hi - covering.start, dtype))

    def verify() -> None:
        for seg, k, target, a, b, dtype in sources:
            values = target.dest[a:b]  # widened on decode at most: casting back is exact
            values = values if values.dtype == dtype else values.astype(dtype)
            seg.verifier.check(k, values, cache=seg.cache, token_start=seg.token_start)

    return extra, verify


def run_reads(reads: Sequence[PendingRead], *, after_io: Callable[[], None] | None = None) -> None:
    """Issues every planned read of ``reads`` in one ``ts.Batch``, checks the caches, then finishes each.

    ``after_io`` is called once the reads and checks are done and blocks read for other threads are
    handed over, before the host work that puts the tokens in place (a stream's producer waits
    there for its turn, ``pipeline/prefetch.py``, ``Shadow``).

    Raises:
        CacheChangedError: a cache read was replaced or changed since it was opened (checked after
            the reads, so no token of a replaced cache is returned).
        CacheIntegrityError: a read failed: a chunk is missing or does not decode.
        StoreUnavailableError: the store did not answer within its retries and the read timeout.
    """
    check = check_all(list(dict.fromkeys(read.check for read in reads if read.check is not None)))
    try:
        try:
            _read_into([target for read in reads for target in read.targets])
        except CacheIntegrityError:
            check()()  # a replaced cache explains a failed read better than the read error does
            raise
        check()()
        for read in reads:  # every block read for others is handed over before anyone waits for one
            if read.publish is not None:
                read.publish()
        if after_io is not None:  # after the hand-over: a held producer never holds others' blocks
            after_io()
        for read in reads:
            if read.finish is not None:
                read.finish()
    except BaseException as error:
        for read in reads:
            if read.abort is not None:
                read.abort(error)
        raise


def check_all(checks: list[Callable[[], Callable[[], None]]]) -> Callable[[], Callable[[], None]]:
    """One check of the caches ``checks`` check (``PendingRead.check``): all started before any is
    completed."""

    def start() -> Callable[[], None]:
        pending = [check() for check in checks]

        def complete() -> None:
            for done in pending:
                done()

        return complete

    return start


def widens_exactly(found: np.dtype, target: np.dtype) -> bool:
    """Every value of ``found`` is a value of ``target`` (so TensorStore may convert on decode)."""
    return np.can_cast(found, target, casting="safe")


def checked_cast(values: np.ndarray, dtype: np.dtype, *, where: str) -> np.ndarray:
    """``values`` as ``dtype``, refusing any value that does not fit (never wraps)."""
    if values.size:
        info = np.iinfo(dtype)
        low, high = int(values.min()), int(values.max())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise OverflowError(f"token id {bad} in cache {where} does not fit {np.dtype(dtype)}")
    return values.astype(dtype, copy=False)


def pieces(
    segments: list[Segment],
    segment_starts: np.ndarray,
    run_starts: np.ndarray,
    run_ends: np.ndarray,
    dest: np.ndarray,
    segment_ends: np.ndarray | None = None,
) -> list[tuple[int, Segment, int, int]]:
    """Each run ``[run_starts[r], run_ends[r])``, read to ``dest[r]`` on, split where it crosses the
    segments placed at ``segment_starts`` (ascending; ending at ``segment_ends``, by default where
    each segment's tokens end): ``(position, segment, local start, local end)`` in run order,
    vectorised. Only the segments a run touches are looked at."""
    if run_starts.size == 0:
        return []
    first = np.searchsorted(segment_starts, run_starts, side="right") - 1
    last = np.searchsorted(segment_starts, run_ends - 1, side="right") - 1
    count = last - first + 1  # pieces of each run: one per segment it touches
    if (count > 1).any():
        placed = np.cumsum(count) - count
        index = np.repeat(first, count) + np.arange(int(count.sum())) - np.repeat(placed, count)
        starts, ends, dest = np.repeat(run_starts, count), np.repeat(run_ends, count), np.repeat(dest, count)
        lo = np.maximum(starts, segment_starts[index])
        if segment_ends is None:
            segment_ends = segment_starts + np.array([seg.tokens for seg in segments], np.int64)
        hi = np.minimum(ends, segment_ends[index])
        dest = dest + (lo - starts)
    else:
        index, lo, hi = first, run_starts, run_ends
    seg_lo = lo - segment_starts[index]
    seg_hi = hi - segment_starts[index]
    return [
        (d, segments[i], a, b)
        for d, i, a, b in zip(dest.tolist(), index.tolist(), seg_lo.tolist(), seg_hi.tolist(), strict=True)
    ]


def _read_into(targets: list[Target]) -> None:
    """Reads each source into its destination array, all in one ``ts.Batch``.

    TensorStore decodes straight into the destination (a ``ts.array`` view of it): no intermediate
    array. Every read is awaited before the first failure is raised, so nothing writes into a
    buffer after this returns.
    """
    timeout = read_timeout_s()
    deadline = time.monotonic() + timeout
    with ts.Batch() as batch:
        futures = [
            ts.array(target.dest, copy=False, write=True).write(target.source, batch=batch)
            for target in targets
        ]
    failed = None
    for target, future in zip(targets, futures, strict=True):
        try:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError as e:
            for pending in futures:
                pending.cancel()
            raise StoreUnavailableError(
                f"{target.describe()}: no answer from the store within {timeout}s (MESHBATCH_READ_TIMEOUT_S)"
            ) from e
        except Exception as e:  # TensorStore reports I/O and decode failures as ValueError and others
            failed = failed or (target, e)
    if failed is not None:
        target, e = failed
        if is_unavailable(e):
            raise StoreUnavailableError(f"{target.describe()}: the store did not answer: {e}") from e
        raise CacheIntegrityError(f"{target.describe()}: read failed: {e}") from e


def _block_key(seg: Segment, k: int, size: int) -> tuple:
    """Block ``k`` of ``seg`` (of its ``identity``); its length is part of the key, so a tail block
    that grew is a new block."""
    return (seg.identity, seg.key, k, min(size, seg.tokens - k * size))


def _plan_blocks(pieces, dest: np.ndarray, cache: BlockCache):
    size = cache.block_tokens
    dtype = np.dtype(pieces[0][1].data.dtype.numpy_dtype) if pieces else dest.dtype
    blocks: dict[tuple, np.ndarray] = {}  # this request's blocks: kept even if the LRU evicts them
    missing: dict[tuple, tuple[Segment, int]] = {}  # blocks this request reads (it owns them)
    waiting: dict[tuple, tuple[Pending, Segment, int]] = {}  # blocks another thread is reading
    wanted: dict[tuple, tuple[Segment, int]] = {}  # every block the pieces touch, once, in order
    for _, seg, lo, hi in pieces:
        identity, array, tokens = seg.identity, seg.key, seg.tokens
        for k in range(lo // size, (hi - 1) // size + 1):
            key = (identity, array, k, min(size, tokens - k * size))  # _block_key, inline: per block a step
            if key not in wanted:
                wanted[key] = (seg, k)
    claimed = cache.claim_each(wanted)
    for (key, (seg, k)), (block, pending, owner) in zip(wanted.items(), claimed, strict=True):
        if block is not None:
            blocks[key] = block
        elif owner:
            missing[key] = (seg, k)
        else:
            waiting[key] = (pending, seg, k)

    # consecutive missing blocks of one segment share a read
    groups: list[list[tuple]] = []
    for key in sorted(missing, key=lambda key: (missing[key][0].token_start, missing[key][1])):
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
        targets.append(Target(np.empty(hi - lo, dtype=dtype), seg.data[lo:hi], seg, lo))

    def publish() -> None:
        for group, target in zip(groups, targets, strict=True):
            array = target.dest
            for j, key in enumerate(group):
                block = array if len(group) == 1 else array[j * size : (j + 1) * size].copy()
                blocks[key] = block
                cache.fulfil(key, block)

    def abort(error: BaseException) -> None:
        for key in missing:
            cache.abandon(key, error)

    def finish() -> None:
        for key, (pending, seg, k) in waiting.items():
            block = _await_block(pending, key)
            if seg.verifier is not None:  # verified by its reader unless that reader does not verify
                seg.verifier.check_within(k * size, block, cache=seg.cache, token_start=seg.token_start)
            blocks[key] = block
        for at, seg, lo, hi in pieces:
            pos = lo
            while pos < hi:
                k = pos // size
                block = blocks[_block_key(seg, k, size)]
                take = min(hi, (k + 1) * size) - pos
                dest[at : at + take] = block[pos - k * size : pos - k * size + take]
                at, pos = at + take, pos + take

    finish.publish, finish.abort = publish, abort  # run_reads calls them through PendingRead
    finish.waited = [
        (seg, k * size, k * size + key[-1]) for key, (_, seg, k) in waiting.items()
    ]  # key[-1]: length
    return targets, finish, sum(target.dest.nbytes for target in targets)


def _await_block(pending: Pending, key: tuple) -> np.ndarray:
    """The block another thread reads for this one, within the read timeout."""
    timeout = read_timeout_s()
    if not pending.done.wait(timeout):
        raise StoreUnavailableError(f"block {key} read by another thread did not arrive within {timeout}s")
    if pending.error is not None:
        error = pending.error
        raise type(error)(f"block {key} read by another thread failed: {error}") from error
    return pending.block
