"""Background producers that keep a steady number of batches ready, and measure the wait.

Workers take the next step to make as soon as fewer than ``depth`` batches are waiting or being
made, so the queue refills as soon as the consumer takes one (no burst-then-drain: a loader that
fetches a big group of batches and then idles until the group is gone starves the consumer at each
boundary). With several workers, steps are made concurrently (reads and host copies release the
GIL) and handed out in order.

    with Prefetcher(make, start=0, depth=4, workers=2) as it:
        batch = next(it)            # waits only if the producers fell behind
    it.stats()["wait_p99_s"]        # how long the consumer waited (p50/p95/p99/max), stall_fraction, ...

A worker starts host work only in the shadow of the consumer's step (``Shadow``): after
the consumer took a batch, before it may ask for the next one; never while it waits.

``depth="auto"`` adapts the depth (and the steps made at once) to what is measured (``AutoDepth``):
enough steps in the making to cover the time one step takes to make, counted in consumer steps.

``make(step)`` ends the stream by raising ``EndOfStream``. Any other error is raised to the
consumer at its step and again on every later ``next``: a failed step is never skipped.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import numpy as np

from meshbatch.arguments import check_int

from .telemetry import RECENT, StreamLog, bind

logger = logging.getLogger(__name__)
T = TypeVar("T")
_local = threading.local()


class EndOfStream(Exception):
    """Raised by a producer for the first step past the end of its stream."""


class StreamClosedError(RuntimeError):
    """``next`` on a stream that was closed (``close()``, the end of its ``with`` block)."""


class _Workers:
    """The threads and what they share; holds no reference to the ``Prefetcher`` (so dropping the
    prefetcher lets ``weakref.finalize`` stop them)."""

    def __init__(
        self,
        produce: Callable[[int], object],
        start: int,
        depth: int,
        workers: int,
        log: StreamLog,
        auto: AutoDepth | None = None,
    ):
        self.produce, self.depth, self.log, self.auto = produce, depth, log, auto
        # One lock, two queues of waiters: a freed slot wakes one idle worker (``claimable``), a
        # made step wakes the consumer (``finished``). Waking every thread on every change would
        # make idle workers contend for the GIL exactly when the consumer takes a batch.
        self.lock = threading.Lock()
        self.claimable = threading.Condition(self.lock)
        self.finished = threading.Condition(self.lock)
        self.turn = threading.Condition(self.lock)  # producers held back by the shadow rule
        self.shadow, self.held = Shadow(), 0
        self.pieces = threading.local()  # per worker: when its host work after the reads began
        self.done: dict[int, tuple[bool, object]] = {}  # step -> (ok, item or exception)
        self.next_claim = start  # next step a worker will make
        self.consumed = start  # next step the consumer receives
        self.end: int | None = None  # first step past the stream's end
        self.stopped = False
        join_at_exit(self)
        self.threads = [
            threading.Thread(target=self.work, name=f"meshbatch-prefetch-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self.threads:
            thread.start()

    def work(self) -> None:
        bind(self.log)
        _local.wait, _local.done = self.turn_after_reads, self.work_done  # for wait_turn, host_work_done
        while True:
            with self.lock:
                while not self.stopped and self.next_claim - self.consumed >= self.depth:
                    if self.end is not None and self.next_claim >= self.end:
                        break
                    self.claimable.wait()
                if self.stopped or (self.end is not None and self.next_claim >= self.end):
                    return  # nothing left to make: the thread ends
                step = self.next_claim
                self.next_claim += 1
            began = time.perf_counter()
            self.pieces.began = None  # a failed step's piece is not measured
            try:
                self.wait_turn()  # making a step starts with host work
                result = (True, self.produce(step))
                self.log.add_made(step, time.perf_counter() - began)
                self.work_done()
            except EndOfStream:
                with self.lock:
                    self.end = step if self.end is None else min(self.end, step)
                    self.claimable.notify_all()
                    self.finished.notify_all()
                continue
            except StopIteration as error:  # a for loop would read it as the end (PEP 479)
                failure = RuntimeError(f"producing step {step} raised StopIteration")
                failure.__cause__ = error
                result = (False, failure)
            except BaseException as error:  # handed to the consumer, raised there
                result = (False, error)
            with self.lock:
                if not self.stopped:  # a closed stream keeps no batch made after close()
                    self.done[step] = result
                self.finished.notify_all()  # the consumer, if it waits
            if self.auto is not None:
                self.adapt()

    def wait_turn(self) -> None:
        """Holds a producer back until the ``Shadow`` rule lets host work start (bounded: at most
        about the consumer's longest recent time away)."""
        began = None
        with self.lock:
            while not self.stopped:
                delay = self.shadow.wait_s(time.perf_counter())
                if delay <= 0:
                    break
                began = began or time.perf_counter()
                self.held += 1
                self.turn.wait(delay)
                self.held -= 1
            if began is not None and self.held:
                self.turn.notify_all()  # the window is open: for the others held too
        if began is not None:
            self.log.held.append(time.perf_counter() - began)

    def turn_after_reads(self) -> None:
        """``wait_turn`` for the host work after a step's reads, which is timed (``work_done``)."""
        self.wait_turn()
        self.pieces.began = time.perf_counter()

    def work_done(self) -> None:
        """Records the host work since this thread's reads (``Shadow.record_work``), if any: called
        by the producer where its host work ends (``host_work_done``), else after the step."""
        began = getattr(self.pieces, "began", None)
        if began is not None:
            self.pieces.began = None
            with self.lock:
                self.shadow.record_work(time.perf_counter() - began)

    def adapt(self) -> None:
        """Re-evaluates the ``AutoDepth`` rule after a step is made: in a worker, so the consumer's
        ``next`` does no statistics."""
        depth = self.auto.depth(self.log)
        with self.lock:
            if depth == self.depth:
                return
            if depth > self.depth:
                self.claimable.notify(depth - self.depth)  # that many more steps may be claimed
            self.depth = depth
        self.log.depth.append((time.perf_counter(), depth))
        logger.info("prefetch depth -> %d", depth)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.done.clear()  # release the batches nobody will take
            self.claimable.notify_all()
            self.finished.notify_all()
            self.turn.notify_all()


_LIVE: weakref.WeakSet[_Workers] = weakref.WeakSet()  # every stream's workers not yet collected
_WARMING: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # warm-ups (``pipeline.Warm``) under way
_EXIT_TIMEOUT_S = 30.0
_hooked = False


def join_at_exit(item: _Workers | threading.Thread) -> None:
    """Tracks a stream's workers or a warm-up thread so that interpreter exit stops and joins
    them (``stop_all``); the first call registers the exit hook, after jax's own (``atexit`` runs
    the newest first)."""
    global _hooked
    if not _hooked:
        atexit.register(stop_all)
        _hooked = True
    (_WARMING if isinstance(item, threading.Thread) else _LIVE).add(item)


def join_threads(threads, timeout_s: float = _EXIT_TIMEOUT_S) -> list[str]:
    """Joins ``threads`` but the calling one, waiting at most ``timeout_s`` in all; returns the
    names of those still alive."""
    deadline = time.monotonic() + timeout_s
    others = [thread for thread in threads if thread is not threading.current_thread()]
    for thread in others:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread.name for thread in others if thread.is_alive()]


def join_warmups(timeout_s: float = _EXIT_TIMEOUT_S) -> None:
    """Waits (at most ``timeout_s`` in all) for the warm-ups under way."""
    join_threads(list(_WARMING), timeout_s)


def stop_all(timeout_s: float = _EXIT_TIMEOUT_S) -> None:
    """Stops every stream's workers and waits (at most ``timeout_s`` in all) for the step each is
    making, and for the warm-ups under way. Run at interpreter exit: a daemon thread still inside
    jax or TensorStore when Python finalizes is ended in the middle of C++ code (``terminate
    called after throwing ...``, exit 134), so a program that never closed its iterators still
    exits cleanly."""
    live = list(_LIVE)
    for workers in live:
        workers.stop()
    stuck = join_threads([thread for workers in live for thread in workers.threads], timeout_s)
    if stuck:
        logger.warning("prefetch threads %s still making a step after %.0f s", stuck, timeout_s)
    join_warmups(timeout_s)


class Prefetcher(Generic[T], Iterator[T]):
    """Iterates ``produce(start), produce(start + 1), ...`` made by background threads.

    Args:
        produce: makes the item of one step; raising ``EndOfStream`` ends the stream there.
        start: the first step.
        depth: items ready or in the making ahead of the consumer (>= 1), or ``"auto"``: adapted
            to measured times by ``AutoDepth``, one thread per item in the making.
        workers: threads making items concurrently (>= 1, at most ``depth``; unused with "auto").
        max_depth: the most items ``"auto"`` keeps in the making.
        on_take: called with each step as the consumer receives it.

    Use it as a context manager, or call ``close()``; an unreferenced prefetcher also stops.
    """

    def __init__(
        self,
        produce: Callable[[int], T],
        *,
        start: int = 0,
        depth: int | str = 4,
        workers: int = 1,
        on_take: Callable[[int], None] | None = None,
        max_depth: int = 8,
    ):
        self.auto = None
        if depth == "auto":
            check_int("max_depth", max_depth, low=AutoDepth.min_depth)
            self.auto = AutoDepth(max_depth=max_depth)
            depth, workers = self.auto.initial, self.auto.max_depth  # threads beyond depth idle
        else:
            check_prefetch(depth, workers)
        self._on_take = on_take
        self.log = StreamLog()
        self._workers = _Workers(produce, start, depth, workers, self.log, self.auto)
        self._finalizer = weakref.finalize(self, self._workers.stop)
        self._failure: BaseException | None = None

    @property
    def depth(self) -> int:
        """The current prefetch depth (changes over time with ``depth="auto"``)."""
        return self._workers.depth

    @property
    def step(self) -> int:
        """The next step ``next`` returns."""
        return self._workers.consumed

    def __next__(self) -> T:
        if self._failure is not None:
            raise self._failure
        shared = self._workers
        start = time.perf_counter()
        with shared.lock:
            shared.shadow.asked(start)
            ready = sum(1 for s in shared.done if s >= shared.consumed)
            while shared.consumed not in shared.done:
                if shared.end is not None and shared.consumed >= shared.end:
                    raise StopIteration
                if shared.stopped:
                    raise StreamClosedError(
                        f"this batch stream was closed (close() or the end of its with-block) before "
                        f"step {shared.consumed}; to go on from there, start a new one: "
                        f"pipeline.iterate_from({shared.consumed})"
                    )
                if not shared.shadow.waiting:  # a waiting consumer holds no producer back
                    shared.shadow.waiting = True
                    shared.turn.notify_all()
                shared.finished.wait()
            ok, item = shared.done.pop(shared.consumed)
            shared.shadow.took(time.perf_counter())
            if shared.held:  # one held worker learns of this take; it wakes the others when the
                shared.turn.notify()  # window opens (all of them now would contend with the consumer)
            if ok:
                shared.consumed += 1
                shared.claimable.notify()  # one slot freed: one worker may claim one more step
        self.log.add_ask(start)
        self.log.waits.append(time.perf_counter() - start)
        self.log.ready.append(ready)
        if not ok:
            self._failure = item
            self.close()
            raise item
        if self._on_take is not None:
            self._on_take(self._workers.consumed - 1)
        return item

    def stats(self) -> dict[str, float]:
        """What the stream measured (``telemetry.StreamLog.summary``): consumer wait p50/p95/p99/max
        and mean (seconds), ``stall_fraction`` of the consumer's time, ``step_p50_s``, batches ready
        when it asked (``ready_mean``/``ready_min``), time to make a step and to read its tokens
        (``make_*``, ``read_*``), and the current ``depth``."""
        return {**self.log.summary(), "depth": self._workers.depth}

    def occupancy(self) -> np.ndarray:
        """Prefetch occupancy over time: ``[batches, 2]`` (seconds since start, batches ready)."""
        return self.log.occupancy()

    def reset_stats(self) -> None:
        """Forget what was measured so far (e.g. the first batch's wait, which includes compiling)."""
        self.log.clear()

    def close(self) -> None:
        """Stops the workers once their current step is made; safe to call more than once."""
        self._finalizer()
        for name in join_threads(self._workers.threads):
            logger.warning("prefetch thread %s did not stop in %.0fs", name, _EXIT_TIMEOUT_S)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_prefetch(depth: int | str, workers: int, *, depth_name: str = "depth") -> None:
    """Raise for a prefetch depth (a positive int or ``"auto"``) or worker count that is not a
    positive int (``TypeError`` for the type, ``ValueError`` for the value) or more workers than depth."""
    if isinstance(depth, str) and depth == "auto":  # an array compared to "auto" is no bool
        check_int("workers", workers, low=1)
        return
    check_int(depth_name, depth, low=1)
    check_int("workers", workers, low=1)
    if workers > depth:
        raise ValueError(f"workers={workers} must not exceed the prefetch depth={depth}")


class AutoDepth:
    """The prefetch depth from measured times: steps in the making cover the time to make one.

    Rule (re-evaluated by a worker after each step it makes, from the last ``window`` measurements)::

        depth = clamp(ceil(make_max / step_min) + 1, min_depth, max_depth)

    ``make`` is how long a worker takes to make one step (its reads, with their latency, the host
    work, and the time it was held back for its turn, ``Shadow``), ``step`` the consumer's time
    between two ``next`` calls. Reads of step ``k + d`` are then under way while step ``k`` is
    consumed. The worst case on both sides counts: the slowest recent step to make (the steps that
    start a new shuffle window read all its blocks at once, and a depth sized for the others
    stalls there) against the quickest recent consumer steps (a run of short training steps comes
    for a batch sooner than typical ones). Example: most steps take 0.15 s to make, those that
    open a window 0.45 s; training steps of 0.2-0.3 s -> ceil(2.25) + 1 = 4 steps in the making,
    by 4 threads. Until
    ``window // 4`` steps are measured, the depth stays at ``initial``. An explicit
    integer ``depth`` (``Pipeline(prefetch=8)``) overrides the rule. The measurements are the
    stream's ``recent_*`` windows, which ``reset_stats`` (a report window) does not clear.
    """

    min_depth = 2

    def __init__(self, *, max_depth: int = 8, initial: int = 4, window: int = 32):
        if not 1 <= window <= RECENT:
            raise ValueError(f"window must be in [1, {RECENT}] (got window={window})")
        self.max_depth, self.window = max_depth, window
        self.initial = min(max(initial, self.min_depth), max_depth)

    def depth(self, log: StreamLog) -> int:
        made, asked = list(log.recent_made)[-self.window :], list(log.recent_asked)[-self.window :]
        if len(made) < max(2, self.window // 4) or len(asked) < 3:
            return self.initial
        make = max(made)
        step = float(np.min(np.diff(asked)))
        wanted = int(np.ceil(make / max(step, 1e-6))) + 1
        return min(max(wanted, self.min_depth), self.max_depth)


class Shadow:
    """When producers do host work: in the shadow of the consumer's step.

    A producer's host work (planning, copying tokens, dispatching the build: Python and numpy that hold
    the GIL, on the cores the consumer runs on) delays the consumer when it runs just as the consumer
    asks for its next batch, or just after it took one (when it dispatches its training step): a
    thread that wants the GIL while another runs Python waits up to the switch interval (5 ms) for it.
    Reads are not host work here: they wait on the store with the GIL released, any time.

    Rule, with ``t`` the consumer's latest take and ``away_min``/``away_max`` the shortest and longest
    of its last ``window`` times away (from taking a batch to asking for the next)::

        host work may start in  [t + f * away_min, t + (1 - f) * away_min]        f = 0.1
        or once                 t + (1 + f) * away_max  has passed (the consumer pauses: an eval, a save)
        or while the consumer waits in next(), or before ``min_steps`` times away are measured.

    Work started in the window runs to its end, so the window closes early enough for it: its last
    start is ``(1 - f) * away_min - work``, ``work`` the longest of the recent host-work pieces after a
    step's reads (copies into place, stacking, the build), measured by ``record_work`` - but the
    window stays at least ``[f, 2 f] * away_min`` long. (Otherwise a 10 ms piece started at 0.89 of a
    100 ms step runs past the consumer's next ask, which then waits a GIL switch interval.)

        (min_steps=2) takes at 0.00, 0.31, 0.52, asks at 0.30, 0.50: away 0.30, 0.19 -> min 0.19, max 0.30
        at 0.525: wait 0.014 s (until 0.52 + 0.019)      at 0.60: start (window ends 0.52 + 0.171)
        at 0.70: wait for the next take, at most until 0.52 + 0.33 = 0.85
        pieces of host work measured at 0.05 s: the window closes at 0.52 + 0.171 - 0.05 = 0.641

    Not thread-safe by itself: ``_Workers`` calls it under its lock.
    """

    def __init__(self, *, fraction: float = 0.1, window: int = 32, min_steps: int = 4):
        if not 0 < fraction < 0.5:
            raise ValueError(f"fraction must be in (0, 0.5) (got fraction={fraction})")
        self.fraction, self.min_steps = fraction, min_steps
        self.away: collections.deque[float] = collections.deque(maxlen=window)
        self.taken: float | None = None  # when the consumer took its latest batch
        self.waiting = False  # the consumer waits in next() for a batch
        self.work: collections.deque[float] = collections.deque(maxlen=window)  # host-work pieces

    def record_work(self, seconds: float) -> None:
        """A piece of host work after a step's reads took ``seconds``."""
        self.work.append(seconds)

    def asked(self, now: float) -> None:
        """The consumer asks for a batch (at ``now``)."""
        if self.taken is not None:
            self.away.append(now - self.taken)

    def took(self, now: float) -> None:
        """The consumer took a batch (at ``now``)."""
        self.taken, self.waiting = now, False

    def wait_s(self, now: float) -> float:
        """Seconds until host work may start at ``now``: 0 to start now; a positive number is a
        bound (a take or a wait of the consumer may open the window sooner)."""
        if self.waiting or self.taken is None or len(self.away) < self.min_steps:
            return 0.0
        f, since = self.fraction, now - self.taken
        low, high = min(self.away), max(self.away)
        if since < f * low:
            return f * low - since
        last = max((1 - f) * low - max(self.work, default=0.0), 2 * f * low)  # the work fits before
        if since <= last or since >= (1 + f) * high:
            return 0.0
        return (1 + f) * high - since


def wait_turn() -> None:
    """Called by a producer before host work: returns when the stream's ``Shadow`` rule lets it
    start (at once outside a stream, e.g. ``Pipeline.batch``)."""
    wait = getattr(_local, "wait", None)
    if wait is not None:
        wait()


def host_work_done() -> None:
    """Called by a producer where its host work for a step ends (before it waits on accelerators,
    which the consumer's cores do not feel), so the piece ``Shadow.record_work`` sees is the host's."""
    done = getattr(_local, "done", None)
    if done is not None:
        done()
