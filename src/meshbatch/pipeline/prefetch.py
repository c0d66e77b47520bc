"""Background producers that keep a steady number of batches ready, and measure the wait.

Workers take the next step to make as soon as fewer than ``depth`` batches are waiting or being
made, so the queue refills as soon as the consumer takes one (no burst-then-drain: a loader that
fetches a big group of batches and then idles until the group is gone starves the consumer at each
boundary). With several workers, steps are made concurrently (reads and host copies release the
GIL) and handed out in order.

    with Prefetcher(make, start=0, depth=4, workers=2) as it:
        batch = next(it)            # waits only if the producers fell behind
    it.stats()["wait_mean_s"]       # how long the consumer waited, per batch

``make(step)`` ends the stream by raising ``EndOfStream``. Any other error is raised to the
consumer at its step and again on every later ``next``: a failed step is never skipped.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import numpy as np

from meshbatch.arguments import check_int

logger = logging.getLogger(__name__)
T = TypeVar("T")


class EndOfStream(Exception):
    """Raised by a producer for the first step past the end of its stream."""


class _Workers:
    """The threads and what they share; holds no reference to the ``Prefetcher`` (so dropping the
    prefetcher lets ``weakref.finalize`` stop them)."""

    def __init__(self, produce: Callable[[int], object], start: int, depth: int, workers: int):
        self.produce, self.depth = produce, depth
        self.lock = threading.Condition()
        self.done: dict[int, tuple[bool, object]] = {}  # step -> (ok, item or exception)
        self.next_claim = start  # next step a worker will make
        self.consumed = start  # next step the consumer receives
        self.end: int | None = None  # first step past the stream's end
        self.stopped = False
        self.threads = [
            threading.Thread(target=self.work, name=f"meshbatch-prefetch-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self.threads:
            thread.start()

    def work(self) -> None:
        while True:
            with self.lock:
                while not self.stopped and self.next_claim - self.consumed >= self.depth:
                    if self.end is not None and self.next_claim >= self.end:
                        break
                    self.lock.wait()
                if self.stopped or (self.end is not None and self.next_claim >= self.end):
                    return  # nothing left to make: the thread ends
                step = self.next_claim
                self.next_claim += 1
            try:
                result = (True, self.produce(step))
            except EndOfStream:
                with self.lock:
                    self.end = step if self.end is None else min(self.end, step)
                    self.lock.notify_all()
                continue
            except StopIteration as error:  # a for loop would read it as the end (PEP 479)
                failure = RuntimeError(f"producing step {step} raised StopIteration")
                failure.__cause__ = error
                result = (False, failure)
            except BaseException as error:  # handed to the consumer, raised there
                result = (False, error)
            with self.lock:
                self.done[step] = result
                self.lock.notify_all()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.done.clear()  # release the batches nobody will take
            self.lock.notify_all()


class Prefetcher(Generic[T], Iterator[T]):
    """Iterates ``produce(start), produce(start + 1), ...`` made by background threads.

    Args:
        produce: makes the item of one step; raising ``EndOfStream`` ends the stream there.
        start: the first step.
        depth: items ready or in the making ahead of the consumer (>= 1).
        workers: threads making items concurrently (>= 1, at most ``depth``).
        on_take: called with each step as the consumer receives it.

    Use it as a context manager, or call ``close()``; an unreferenced prefetcher also stops.
    """

    def __init__(
        self,
        produce: Callable[[int], T],
        *,
        start: int = 0,
        depth: int = 4,
        workers: int = 1,
        on_take: Callable[[int], None] | None = None,
    ):
        check_prefetch(depth, workers)
        self._on_take = on_take
        self._workers = _Workers(produce, start, depth, workers)
        self._finalizer = weakref.finalize(self, self._workers.stop)
        self._failure: BaseException | None = None
        self._waits: list[float] = []
        self._ready_at_take: list[int] = []

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
            ready = sum(1 for s in shared.done if s >= shared.consumed)
            while shared.consumed not in shared.done:
                if shared.end is not None and shared.consumed >= shared.end:
                    raise StopIteration
                if shared.stopped:
                    raise RuntimeError("the prefetcher was closed")
                shared.lock.wait()
            ok, item = shared.done.pop(shared.consumed)
            if ok:
                shared.consumed += 1
                shared.lock.notify_all()  # a worker may claim another step
        self._waits.append(time.perf_counter() - start)
        self._ready_at_take.append(ready)
        if not ok:
            self._failure = item
            self.close()
            raise item
        if self._on_take is not None:
            self._on_take(self._workers.consumed - 1)
        return item

    def stats(self) -> dict[str, float]:
        """Consumer wait per batch (seconds) and how many batches were ready when it asked."""
        waits = np.asarray(self._waits) if self._waits else np.zeros(1)
        ready = np.asarray(self._ready_at_take) if self._ready_at_take else np.zeros(1)
        return {
            "batches": len(self._waits),
            "wait_total_s": float(waits.sum()),
            "wait_mean_s": float(waits.mean()),
            "wait_p50_s": float(np.percentile(waits, 50)),
            "wait_p95_s": float(np.percentile(waits, 95)),
            "wait_max_s": float(waits.max()),
            "ready_mean": float(ready.mean()),
            "ready_min": float(ready.min()),
        }

    def reset_stats(self) -> None:
        """Forget the waits so far (e.g. the first batch's, which includes compiling)."""
        self._waits.clear()
        self._ready_at_take.clear()

    def close(self) -> None:
        """Stops the workers once their current step is made; safe to call more than once."""
        self._finalizer()
        for thread in self._workers.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=30)
                if thread.is_alive():
                    logger.warning("prefetch thread %s did not stop within 30s", thread.name)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_prefetch(depth: int, workers: int, *, depth_name: str = "depth") -> None:
    """Raise for a prefetch depth or worker count that is not a positive int (``TypeError`` for
    the type, ``ValueError`` for the value) or more workers than depth."""
    check_int(depth_name, depth, low=1)
    check_int("workers", workers, low=1)
    if workers > depth:
        raise ValueError(f"workers={workers} must not exceed the prefetch depth={depth}")
