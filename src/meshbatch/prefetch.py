"""A background producer that keeps a steady number of batches ready, and measures the wait.

The producer makes one batch at a time and blocks only when ``depth`` batches are waiting, so the
queue refills as soon as the consumer takes one (no burst-then-drain: a loader that fetches a big
group of batches and then idles until the group is gone starves the consumer at each boundary).

    it = Prefetcher(lambda step: make(step), start=0, depth=4)
    batch = next(it)            # waits only if the producer fell behind
    it.stats()["wait_mean_s"]   # how long the consumer waited, per batch
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import numpy as np

logger = logging.getLogger(__name__)
T = TypeVar("T")
_DONE = object()


class Prefetcher(Generic[T], Iterator[T]):
    """Iterates ``produce(start), produce(start + 1), ...`` from a background thread.

    Args:
        produce: makes the item of one step; ``StopIteration`` ends the stream.
        start: the first step.
        depth: items kept ready ahead of the consumer (>= 1).
    """

    def __init__(self, produce: Callable[[int], T], *, start: int = 0, depth: int = 4):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1 (got depth={depth})")
        self._produce = produce
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._waits: list[float] = []
        self._ready_at_take: list[int] = []
        self.step = start
        self._thread = threading.Thread(
            target=self._run, args=(start,), name="meshbatch-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, step: int) -> None:
        try:
            while not self._stop.is_set():
                try:
                    item = self._produce(step)
                except StopIteration:
                    break
                if not self._put((step, item)):
                    return
                step += 1
        except BaseException as error:  # handed to the consumer, raised there
            self._put(error)
            return
        self._put(_DONE)

    def __next__(self) -> T:
        ready = self._queue.qsize()
        start = time.perf_counter()
        got = self._queue.get()
        self._waits.append(time.perf_counter() - start)
        self._ready_at_take.append(ready)
        if got is _DONE:
            self._put(_DONE)  # keep later calls ending too
            raise StopIteration
        if isinstance(got, BaseException):
            raise got
        self.step, item = got[0] + 1, got[1]
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
        """Stops the producer; safe to call more than once."""
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            logger.warning("prefetch thread did not stop within 10s")

    def __del__(self):
        self._stop.set()
