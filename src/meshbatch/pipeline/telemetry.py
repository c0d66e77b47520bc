"""What a stream measured: consumer waits, step times, prefetch occupancy, read latency.

The consumer side is recorded at each ``next``: when it asked, how long it waited, how many
batches were ready. The producer side at each step made: how long making it took and how long its
reads took (``record_read``, called by ``fetch`` in the producing thread). ``summary`` turns them
into the numbers a user watches::

    asked at t = 0.0, 0.30, 0.60, 0.95 ; waited 0.0, 0.0, 0.05, 0.0
    -> step_s p50 0.30 (time between asks), stall_fraction = 0.05 / 0.95,
       wait p50/p95/p99/max over the 4 waits, ready_mean / ready_min, occupancy = [(t, ready), ...]

``stall_fraction`` is the share of the consumer's wall time (first ask to last batch received) spent
waiting for data: 0 for a loader that always has a batch ready.

Host time of a step by phase (plan, fetch, place, build, ...), for a caller that asks.

``Pipeline`` marks its phases with ``phase(name)``; nothing is recorded unless the current thread
is inside ``phase_times()``, which collects the seconds each phase took (summed if it recurs):

    with phase_times() as times:
        pipeline.batch(step)
    times  # {"plan": 0.0021, "fetch": 0.0043, "build": 0.0012, "global": 0.0004}

Phases time the host's calls only: a build dispatched asynchronously is done when its arrays are
ready (``jax.block_until_ready``), which the caller times itself.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

_local = threading.local()
RECENT = 64  # asks and makes kept for AutoDepth across report windows (its window is at most this)


def quantiles(values, prefix: str, unit: str = "s") -> dict[str, float]:
    """``{prefix_p50_s, prefix_p95_s, prefix_p99_s, prefix_max_s, prefix_mean_s}`` of ``values``."""
    v = np.asarray(values, dtype=np.float64) if len(values) else np.zeros(1)
    out = {f"{prefix}_p{q}_{unit}": float(np.percentile(v, q)) for q in (50, 95, 99)}
    out[f"{prefix}_max_{unit}"] = float(v.max())
    out[f"{prefix}_mean_{unit}"] = float(v.mean())
    return out


# Histogram buckets of the exported durations, in nanoseconds as Grain's: powers of 2 up to an hour
# for the consumer's next() (Grain's next_duration_ns), powers of 4 for reads (source_read_time_ns).
NEXT_BUCKETS_NS = tuple(float(2**k) for k in range(42))
READ_BUCKETS_NS = tuple(float(4**k) for k in range(21))


class Cumulative:
    """Counts of durations per bucket since a stream began, their sum and count: what a
    report window (``StreamLog.clear``) forgets is kept here, so exported histograms only grow."""

    def __init__(self, bounds_ns: tuple[float, ...]):
        self.bounds_ns = np.asarray(bounds_ns)
        self.counts = np.zeros(len(bounds_ns) + 1, np.int64)  # the last: above every bound
        self.sum_s = 0.0

    def add(self, seconds) -> None:
        values = np.asarray(seconds, np.float64)
        if values.size:
            index = np.searchsorted(self.bounds_ns, values * 1e9, side="left")
            self.counts += np.bincount(index, minlength=len(self.counts))
            self.sum_s += float(values.sum())

    def merged(self, seconds) -> Cumulative:
        """A copy with ``seconds`` added (the values not yet retired)."""
        out = Cumulative(tuple(self.bounds_ns))
        out.counts, out.sum_s = self.counts.copy(), self.sum_s
        out.add(list(seconds))
        return out


@dataclass
class StreamLog:
    """Everything one stream recorded (appends are atomic under the GIL; lists only grow)."""

    started: float = field(default_factory=time.perf_counter)
    asked: list[float] = field(default_factory=list)  # when the consumer called next
    waits: list[float] = field(default_factory=list)  # how long it waited
    ready: list[int] = field(default_factory=list)  # batches ready when it asked
    made: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds to make it)
    reads: list[float] = field(default_factory=list)  # seconds per batch of reads
    depth: list[tuple[float, int]] = field(default_factory=list)  # (time, prefetch depth) changes
    held: list[float] = field(default_factory=list)  # seconds a producer was held back (prefetch.Shadow)
    # the latest asks and makes whatever ``clear`` forgets: what ``AutoDepth`` sizes the depth from
    recent_asked: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_made: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))

    # what ``clear`` forgot of the waits and reads (for ``cumulative``)
    retired_waits: Cumulative = field(default_factory=lambda: Cumulative(NEXT_BUCKETS_NS))
    retired_reads: Cumulative = field(default_factory=lambda: Cumulative(READ_BUCKETS_NS))

    def cumulative(self) -> tuple[Cumulative, Cumulative]:
        """The consumer's waits in ``next()`` and the batches of reads since the stream began,
        as bucket counts (``NEXT_BUCKETS_NS``, ``READ_BUCKETS_NS``), across report windows."""
        return self.retired_waits.merged(list(self.waits)), self.retired_reads.merged(list(self.reads))

    def add_ask(self, when: float) -> None:
        self.asked.append(when)
        self.recent_asked.append(when)

    def add_made(self, step: int, seconds: float) -> None:
        self.made.append((step, seconds))
        self.recent_made.append(seconds)

    def clear(self) -> None:
        """Starts the summary afresh (a report window); the ``recent_*`` windows stay."""
        self.started = time.perf_counter()
        self.retired_waits.add(list(self.waits))
        self.retired_reads.add(list(self.reads))
        for values in (self.asked, self.waits, self.ready, self.made, self.reads, self.depth, self.held):
            values.clear()

    def summary(self) -> dict[str, float]:
        waits = self.waits
        total = float(np.sum(waits)) if waits else 0.0
        out: dict[str, float] = {"batches": len(waits), "wait_total_s": total}
        out.update(quantiles(waits, "wait"))
        if len(self.asked) >= 2:
            span = self.asked[-1] + waits[-1] - self.asked[0]
            out["step_p50_s"] = float(np.median(np.diff(self.asked)))
            out["stall_fraction"] = float(np.sum(waits) / span) if span > 0 else 0.0
        else:
            out["step_p50_s"], out["stall_fraction"] = 0.0, 0.0
        ready = np.asarray(self.ready) if self.ready else np.zeros(1)
        out["ready_mean"], out["ready_min"] = float(ready.mean()), float(ready.min())
        out.update(quantiles([s for _, s in self.made], "make"))
        reads = list(self.reads)
        out["read_batches"] = len(reads)
        out.update({k: v for k, v in quantiles(reads, "read").items() if "_p95" not in k})
        out["held_total_s"], out["held_count"] = (
            float(np.sum(self.held)) if self.held else 0.0,
            len(self.held),
        )
        return out

    def occupancy(self) -> np.ndarray:
        """float64 ``[batches, 2]``: seconds since the stream started, batches ready, at each ask."""
        n = min(len(self.asked), len(self.ready))
        return np.stack([np.asarray(self.asked[:n]) - self.started, np.asarray(self.ready[:n], float)], 1)


def bind(log: StreamLog | None) -> None:
    """Makes ``log`` the one ``record_read`` writes to in this thread (a producer thread)."""
    _local.log = log


def record_read(seconds: float) -> None:
    """Records one batch of reads' latency in the calling thread's stream log, if it has one."""
    log = getattr(_local, "log", None)
    if log is not None:
        log.reads.append(seconds)


def read_counters(dataset) -> dict[str, int]:
    """Reads issued and bytes read so far by every source of ``dataset`` that counts them."""
    total = {"reads_issued": 0, "bytes_read": 0}
    for source in getattr(dataset, "sources", ()):
        counters = getattr(source, "counters", None)
        if counters is not None:
            now = counters.as_dict()
            for key in total:
                total[key] += int(now.get(key, 0))
    return total


def pipeline_stats(
    pipeline, summary: dict[str, float], log: StreamLog, since: dict[str, int]
) -> dict[str, float]:
    """A ``Pipeline`` stream's ``stats()`` (``summary``, its ``log``) plus reads per example over
    the steps it made.

    ``requests_per_example`` counts TensorStore reads (one per coalesced run and shard) and
    ``bytes_per_example`` the bytes they decoded, per example made since the stream began (the
    zero rows of a padded final step are no examples).
    """
    out = dict(summary)
    examples = sum(pipeline._real_rows(step) for step, _ in list(log.made))
    now = read_counters(pipeline.dataset)
    out["examples_made"] = examples
    for key, name in (("reads_issued", "requests_per_example"), ("bytes_read", "bytes_per_example")):
        out[name] = (now[key] - since[key]) / examples if examples else 0.0
    return out


_local = threading.local()


@contextlib.contextmanager
def phase_times() -> Iterator[dict[str, float]]:
    """Collects, in a dict, the seconds each phase marked by this thread takes within the block."""
    outer = getattr(_local, "times", None)
    _local.times = times = {}
    try:
        yield times
    finally:
        _local.times = outer


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Marks the block as phase ``name`` of the current thread's step (free when nobody asks)."""
    times = getattr(_local, "times", None)
    if times is None:
        yield
        return
    began = time.perf_counter()
    try:
        yield
    finally:
        times[name] = times.get(name, 0.0) + time.perf_counter() - began
