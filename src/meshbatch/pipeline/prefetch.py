"""Background producers that keep a steady number of batches ready, and measure the wait.

Workers take the next step to make as soon as fewer than ``depth`` batches are waiting or being
made, so the queue refills as soon as the consumer takes one (no burst-then-drain: a loader that
fetches a big group of batches and then idles until the group is gone starves the consumer at each
boundary). With several workers, steps are made concurrently (reads and host copies release the
GIL) and handed out in order.

    with Prefetcher(make, start=0, depth=4, workers=2) as it:
        batch = next(it)            # waits only if the producers fell behind
    it.stats()["wait_p99_s"]        # how long the consumer waited (p50/p95/p99/max), stall_fraction, ...

A worker starts host work only in the shadow of the consumer's step (``shadow.Shadow``): after
the consumer took a batch, before it may ask for the next one; never while it waits.

``depth="auto"`` adapts the depth (and the steps made at once) to what is measured (``AutoDepth``):
enough steps in the making to cover the time one step takes to make, counted in consumer steps.

``make(step)`` ends the stream by raising ``EndOfStream``. Any other error is raised to the
consumer at its step and again on every later ``next``: a failed step is never skipped.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import numpy as np

from meshbatch.arguments import check_int

from .shadow import Shadow, bind_turn
from .telemetry import RECENT, StreamLog, bind

logger = logging.getLogger(__name__)
T = TypeVar("T")


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
        _register(self)
        self.threads = [
            threading.Thread(target=self.work, name=f"meshbatch-prefetch-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self.threads:
            thread.start()

    def work(self) -> None:
        bind(self.log)
        bind_turn(self.turn_after_reads, self.work_done)
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
        by the producer where its host work ends (``shadow.host_work_done``), else after the step."""
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
_EXIT_TIMEOUT_S = 30.0
_hooked = False


def _register(workers: _Workers) -> None:
    """Tracks ``workers`` so that interpreter exit stops them (``stop_all``); the first call
    registers the exit hook, after jax's own (``atexit`` runs the newest first)."""
    global _hooked
    if not _hooked:
        atexit.register(stop_all)
        _hooked = True
    _LIVE.add(workers)


def stop_all(timeout_s: float = _EXIT_TIMEOUT_S) -> None:
    """Stops every stream's workers and waits (at most ``timeout_s`` in all) for the step each is
    making. Run at interpreter exit: a daemon worker still inside jax or TensorStore when Python
    finalizes is ended in the middle of C++ code (``terminate called after throwing ...``, exit
    134), so a program that never closed its iterators still exits cleanly."""
    live = list(_LIVE)
    for workers in live:
        workers.stop()
    deadline = time.monotonic() + timeout_s
    for workers in live:
        for thread in workers.threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for w in live for t in w.threads if t.is_alive()]
    if stuck:
        logger.warning("prefetch threads %s still making a step after %.0f s", stuck, timeout_s)


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
        deadline = time.monotonic() + _EXIT_TIMEOUT_S  # one deadline for all, not 30 s per thread
        for thread in self._workers.threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    logger.warning("prefetch thread %s did not stop in %.0fs", thread.name, _EXIT_TIMEOUT_S)

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
    work, and the time it was held back for its turn, ``shadow.py``), ``step`` the consumer's time
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
