"""Background producers that keep a steady number of batches ready, and measure the wait.

Workers take the next step to make as soon as fewer than ``depth`` batches are waiting or being
made, so the queue refills as soon as the consumer takes one (no burst-then-drain: a loader that
fetches a big group of batches and then idles until the group is gone starves the consumer at each
boundary). With several workers, steps are made concurrently (reads and host copies release the
GIL) and handed out in order.

    it = Prefetcher(lambda step: make(step), start=0, depth=4, workers=2)
    batch = next(it)            # waits only if the producers fell behind
    it.stats()["wait_mean_s"]   # how long the consumer waited, per batch
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import numpy as np

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Prefetcher(Generic[T], Iterator[T]):
    """Iterates ``produce(start), produce(start + 1), ...`` made by background threads.

    Args:
        produce: makes the item of one step; ``StopIteration`` ends the stream there.
        start: the first step.
        depth: items ready or in the making ahead of the consumer (>= 1).
        workers: threads making items concurrently (>= 1, at most ``depth``).
    """

    def __init__(self, produce: Callable[[int], T], *, start: int = 0, depth: int = 4, workers: int = 1):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1 (got depth={depth})")
        if not 1 <= workers <= depth:
            raise ValueError(f"workers must be in [1, depth={depth}] (got workers={workers})")
        self._produce = produce
        self._depth = depth
        self._lock = threading.Condition()
        self._done: dict[int, tuple[bool, object]] = {}  # step -> (ok, item or exception)
        self._next_claim = start  # next step a worker will make
        self._end: int | None = None  # first step past the stream's end
        self._stopped = False
        self._waits: list[float] = []
        self._ready_at_take: list[int] = []
        self.step = start  # next step the consumer receives
        self._threads = [
            threading.Thread(target=self._work, name=f"meshbatch-prefetch-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._stopped and (
                    self._next_claim - self.step >= self._depth
                    or (self._end is not None and self._next_claim >= self._end)
                ):
                    self._lock.wait()
                if self._stopped:
                    return
                step = self._next_claim
                self._next_claim += 1
            try:
                result = (True, self._produce(step))
            except StopIteration:
                with self._lock:
                    self._end = step if self._end is None else min(self._end, step)
                    self._lock.notify_all()
                continue
            except BaseException as error:  # handed to the consumer, raised there
                result = (False, error)
            with self._lock:
                self._done[step] = result
                self._lock.notify_all()

    def __next__(self) -> T:
        start = time.perf_counter()
        with self._lock:
            ready = sum(1 for s in self._done if s >= self.step)
            while self.step not in self._done:
                if self._end is not None and self.step >= self._end:
                    raise StopIteration
                if self._stopped:
                    raise RuntimeError("prefetcher was closed")
                self._lock.wait()
            ok, item = self._done.pop(self.step)
            self.step += 1
            self._lock.notify_all()  # a worker may claim another step
        self._waits.append(time.perf_counter() - start)
        self._ready_at_take.append(ready)
        if not ok:
            raise item
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
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)
            if thread.is_alive():
                logger.warning("prefetch thread %s did not stop within 30s", thread.name)

    def __del__(self):
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
