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

``Pipeline.stats()`` where dashboards already are: Prometheus metrics on an HTTP endpoint.

    server = serve_metrics(pipeline, port=9431)      # http://127.0.0.1:9431/metrics
    ...
    server.close()

Needs the ``prometheus`` extra (``pip install meshbatch[prometheus]``: prometheus_client). The
names follow Grain's (``/grain/python/dataset/next_duration_ns`` is exported as
``grain_python_dataset_next_duration_ns``) where the meaning is the same, with ``meshbatch_`` in
place of Grain's path; docs/observing.md has the table. Everything is read at scrape time from the
pipeline's latest stream (its ``StreamLog``) and its sources' read counters: nothing is added to
the step. Histograms and counters count from the pipeline's first stream and never go down: a
report window (``reset_stats``) keeps what it forgets in the log (``StreamLog.cumulative``), and a
new stream's counts are added to those of the streams before it. The gauges (the data-wait
fraction, quantiles) are the current report window's, as ``stats()`` gives them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from meshbatch.datasets.provenance import source_name

logger = logging.getLogger(__name__)
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
        out["held_total_s"] = float(np.sum(self.held)) if self.held else 0.0
        out["held_count"] = len(self.held)
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


def source_counters(dataset) -> list[tuple[object, dict[str, int]]]:
    """``(source, its read counters now)`` for every source of ``dataset`` that counts them."""
    sources = getattr(dataset, "sources", ())
    return [(s, s.counters.as_dict()) for s in sources if getattr(s, "counters", None) is not None]


def read_counters(dataset) -> dict[str, int]:
    """Reads issued and bytes read so far by every source of ``dataset`` that counts them."""
    total = {"reads_issued": 0, "bytes_read": 0}
    for _, now in source_counters(dataset):
        for key in total:
            total[key] += int(now.get(key, 0))
    return total


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


# stats() keys exported as gauges, over the current report window: name -> (key, help)
GAUGES = {
    "meshbatch_data_wait_fraction": ("stall_fraction", "Share of the consumer's time spent waiting for data"),
    "meshbatch_prefetch_buffer_ready_count": ("ready_last", "Batches ready when the consumer last asked"),
    "meshbatch_prefetch_depth": ("depth", "Steps kept ready or in the making"),
    "meshbatch_next_duration_p99_seconds": ("wait_p99_s", "p99 of the consumer's wait in next()"),
    "meshbatch_step_duration_p50_seconds": ("step_p50_s", "Median time between two next() calls"),
    "meshbatch_make_duration_p50_seconds": ("make_p50_s", "Median seconds a worker takes to make a step"),
    "meshbatch_requests_per_example": ("requests_per_example", "TensorStore reads per example made"),
    "meshbatch_bytes_per_example": ("bytes_per_example", "Bytes read per example made"),
}


class PipelineCollector:
    """A prometheus_client collector of one pipeline (held weakly: a dropped pipeline exports
    nothing more)."""

    def __init__(self, pipeline):
        self._pipeline = weakref.ref(pipeline)
        self._lock = threading.Lock()
        self._log = None  # the stream log seen last, and the counts of the streams before it
        self._before = (Cumulative(NEXT_BUCKETS_NS), Cumulative(READ_BUCKETS_NS))

    def _histograms(self, pipeline) -> tuple[Cumulative, Cumulative]:
        log = pipeline._stream_log
        with self._lock:
            if log is not self._log and self._log is not None:  # a new stream: keep the last one's
                waits, reads = self._log.cumulative()
                self._before = tuple(_sum(a, b) for a, b in zip(self._before, (waits, reads), strict=True))
            self._log = log
            if log is None:
                return self._before
            waits, reads = log.cumulative()
            return _sum(self._before[0], waits), _sum(self._before[1], reads)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        pipeline = self._pipeline()
        if pipeline is None:
            return
        waits, reads = self._histograms(pipeline)
        yield _histogram(
            HistogramMetricFamily,
            "meshbatch_next_duration_ns",
            "Nanoseconds the consumer waited in each next()",
            waits,
        )
        yield _histogram(
            HistogramMetricFamily,
            "meshbatch_source_read_time_ns",
            "Nanoseconds of each step's batch of reads, every source at once (Grain: source_read_time_ns)",
            reads,
        )
        read = CounterMetricFamily(
            "meshbatch_bytes_read", "Bytes read from each source (Grain: bytes_read)", labels=["source"]
        )
        issued = CounterMetricFamily(
            "meshbatch_reads_issued", "TensorStore reads issued to each source", labels=["source"]
        )
        for source, now in source_counters(pipeline.dataset):
            read.add_metric([source_name(source)], float(now.get("bytes_read", 0)))
            issued.add_metric([source_name(source)], float(now.get("reads_issued", 0)))
        yield read
        yield issued
        stats = dict(pipeline.stats())
        log = pipeline._stream_log
        if log is not None and log.ready:
            stats["ready_last"] = float(log.ready[-1])
        for name, (key, text) in GAUGES.items():
            if key in stats:
                gauge = GaugeMetricFamily(name, text)
                gauge.add_metric([], float(stats[key]))
                yield gauge


def _sum(a: Cumulative, b: Cumulative) -> Cumulative:
    out = a.merged([])
    out.counts += b.counts
    out.sum_s += b.sum_s
    return out


def _histogram(family, name: str, text: str, c: Cumulative):
    cumulative = c.counts.cumsum()
    buckets = [(f"{bound:.0f}", float(n)) for bound, n in zip(c.bounds_ns, cumulative[:-1], strict=True)]
    buckets.append(("+Inf", float(cumulative[-1])))
    out = family(name, text)
    out.add_metric([], buckets, sum_value=c.sum_s * 1e9)
    return out


class MetricsServer:
    """A running endpoint (``serve_metrics``): ``url``, ``port``, ``close()``."""

    def __init__(self, server, thread, registry, collector):
        self._server, self._thread = server, thread
        self.registry, self.collector = registry, collector
        self.host, self.port = server.server_address[:2]
        self.url = f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stops the server and its thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_metrics(pipeline, *, port: int = 0, addr: str = "127.0.0.1", registry=None) -> MetricsServer:
    """Serves ``pipeline``'s metrics at ``http://addr:port/metrics`` (``port=0``: a free port) in a
    daemon thread, from its own registry unless ``registry`` is given (then only registered
    there: serve that registry yourself, ``server`` is then ``None``).

    Raises:
        ImportError: prometheus_client is not installed (the ``prometheus`` extra).
    """
    try:
        import prometheus_client
    except ImportError as error:
        raise ImportError(
            "Prometheus metrics need prometheus_client: pip install 'meshbatch[prometheus]'"
        ) from error
    collector = PipelineCollector(pipeline)
    own = registry is None
    registry = prometheus_client.CollectorRegistry(auto_describe=True) if own else registry
    registry.register(collector)
    if not own:
        return None
    server, thread = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    metrics = MetricsServer(server, thread, registry, collector)
    logger.info("meshbatch metrics at %s", metrics.url)
    return metrics
