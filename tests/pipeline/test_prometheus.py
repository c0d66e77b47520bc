"""Pipeline.stats() on a Prometheus endpoint: scraped on 127.0.0.1, every documented metric
served, histograms and counters that only grow across report windows and streams."""

import pathlib
import re
import urllib.error
import urllib.request

import jax
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshbatch import Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache
from meshbatch.datasets import CausalLMDataset

DOCS = pathlib.Path(__file__).parents[2] / "docs" / "observing.md"


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family, suffix: str = "", **labels) -> float:
    for sample in family.samples:
        if sample.name == family.name + suffix and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    raise KeyError((family.name, suffix, labels))


def documented_names() -> set[str]:
    """The metric names in the first column of docs/observing.md's Prometheus table."""
    return set(re.findall(r"^\| `(meshbatch_[a-z0-9_]+)`", DOCS.read_text(), flags=re.M))


@pytest.fixture
def pipeline(cache_path):
    dataset = CausalLMDataset(TokenCache.open(cache_path), 16, shuffle=ShuffleSpec("full"), eos_id=1)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    return Pipeline(dataset, mesh=mesh, batch_size=8, key=0, prefetch=2, warmup=False)


def test_the_endpoint_serves_the_documented_metrics(pipeline, cache_path):
    server = pipeline.serve_metrics(port=0)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        with pipeline.iterate_from(0) as stream:
            for _ in range(5):
                next(stream)
        metrics = scrape(server.url)
        names = {name for name in metrics if name.startswith("meshbatch_")}
        assert names == documented_names(), names ^ documented_names()
        stats = pipeline.stats()
        waits = metrics["meshbatch_next_duration_ns"]
        assert value(waits, "_count") == 5
        assert value(waits, "_sum") == pytest.approx(stats["wait_total_s"] * 1e9, rel=1e-6)
        assert value(waits, "_bucket", le="+Inf") == 5
        assert value(metrics["meshbatch_source_read_time_ns"], "_count") == stats["read_batches"] > 0
        source = pipeline.dataset.sources[0]
        read = metrics["meshbatch_bytes_read"]
        assert read.type == "counter"
        assert value(read, "_total", source=cache_path) == source.counters.as_dict()["bytes_read"] > 0
        fraction = value(metrics["meshbatch_data_wait_fraction"])
        assert fraction == pytest.approx(stats["stall_fraction"]) and 0 <= fraction <= 1
        assert value(metrics["meshbatch_prefetch_buffer_ready_count"]) == stream.log.ready[-1]

        pipeline.reset_stats()  # a report window: the histograms keep what it forgets
        with pipeline.iterate_from(5) as stream:  # a new stream: its counts add to the first's
            for _ in range(3):
                next(stream)
        later = scrape(server.url)
        assert value(later["meshbatch_next_duration_ns"], "_count") == 8
        assert value(later["meshbatch_bytes_read"], "_total", source=cache_path) > value(
            read, "_total", source=cache_path
        )
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)
