"""``Pipeline.stats()`` where dashboards already are: Prometheus metrics on an HTTP endpoint.

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

import logging
import threading
import weakref

from meshbatch.datasets.provenance import source_name

from .telemetry import NEXT_BUCKETS_NS, READ_BUCKETS_NS, Cumulative

logger = logging.getLogger(__name__)

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
        for source in getattr(pipeline.dataset, "sources", ()):
            counters = getattr(source, "counters", None)
            if counters is not None:
                now = counters.as_dict()
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
