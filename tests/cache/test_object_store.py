"""Caches in object storage: real servers on 127.0.0.1 (fake-gcs-server, moto), through TensorStore.

Round trips write a cache at ``gs://`` / ``s3://`` and read it back identical to the same cache
written locally; a server stopped mid-run gives ``StoreUnavailableError`` in the consumer within a
bounded time (never zeros, never a hang); a slow, jittery server gives bit-identical batches.
"""

import threading
import time
import uuid

import jax
import numpy as np
import pytest
import tensorstore as ts
from jax.sharding import Mesh
from object_store import GCSServer, LatencyProxy, S3Server

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import (
    BlockCache,
    CacheWriter,
    ShardedCacheWriter,
    StoreUnavailableError,
    TokenCache,
    read_ledger,
)
from meshbatch.cache.format.stores import context_spec_from_stats, store_context_spec

SEQ = 32
SCHEMES = ("gs", "s3")


def docs(n: int = 300, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(2, 30_000, rng.integers(5, 400)), 1).astype(np.int32) for _ in range(n)]


def write(path: str, rows: list[np.ndarray], **kwargs) -> None:
    with CacheWriter(path, flush_tokens=10_000, **kwargs) as writer:
        writer.write(rows)


def url(scheme: str) -> str:
    return f"{scheme}://meshbatch/{uuid.uuid4().hex}/cache"


def fast_failing_context() -> ts.Context:
    """Retries bounded to 2 with short backoff, so a dead server fails a read in about a second."""
    return ts.Context(
        store_context_spec(cache_bytes=64 << 20, retries=2, initial_delay_s=0.05, max_delay_s=0.2)
    )


def mesh(n: int = 2) -> Mesh:
    return Mesh(np.array(jax.devices()[:n]), ("data",))


def pipeline(cache: TokenCache, *, prefetch: int = 2) -> Pipeline:
    spec = ShuffleSpec("block", io_block_size=16, window_blocks=4)
    dataset = CausalLMDataset(cache, SEQ, shuffle=spec, eos_id=1)
    return Pipeline(dataset, mesh=mesh(), batch_size=16, key=7, prefetch=prefetch, workers=1)


class Reference:
    """Batches of one ``pipeline`` over a local cache of ``docs()``, made once per module."""

    def __init__(self, path: str):
        write(path, docs())
        self.pipeline = pipeline(TokenCache.open(path))
        self.batches = {}

    def batch(self, step: int):
        if step not in self.batches:
            self.batches[step] = self.pipeline.batch(step)
        return self.batches[step]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return Reference(str(tmp_path_factory.mktemp("object-store") / "cache"))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_round_trip_matches_a_local_cache(object_stores, tmp_path, scheme):
    rows = docs()
    remote, local = url(scheme), str(tmp_path / "cache")
    write(remote, rows)
    write(local, rows)
    got, want = TokenCache.open(remote), TokenCache.open(local)
    assert got.num_rows == want.num_rows == len(rows)
    np.testing.assert_array_equal(got.doc_offsets(), want.doc_offsets())
    starts = np.random.default_rng(1).integers(0, want.num_tokens - 500, 64)
    for a, b in zip(got.read_spans(starts, 500), want.read_spans(starts, 500), strict=True):
        np.testing.assert_array_equal(a, b)
    for i in (0, 17, len(rows) - 1):
        np.testing.assert_array_equal(got.read_rows([i])[0], rows[i])
    ledger = read_ledger(remote)
    assert ledger.is_finished and ledger.field_counts == read_ledger(local).field_counts
    assert got.counters.as_dict()["reads_issued"] > 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_resume_and_sharded_writes_at_urls(object_stores, scheme):
    rows = docs(120, seed=2)
    remote = url(scheme)
    writer = CacheWriter(remote, flush_tokens=5_000)
    writer.write(rows[:60])
    writer.flush()  # committed, not finished: a later writer resumes it
    with CacheWriter(remote, if_exists="resume") as resumed:
        assert resumed.num_rows == 60
        resumed.write(rows[60:])
    with pytest.raises(FileExistsError, match="already exists"):
        CacheWriter(remote)
    cache = TokenCache.open(remote)
    np.testing.assert_array_equal(np.concatenate(cache.read_rows(np.arange(120))), np.concatenate(rows))

    sharded = url(scheme)
    out = ShardedCacheWriter(sharded)
    out.write_shard("part-0", rows[:50])
    out.write_shard("part-1", rows[50:])
    out.finish()
    cache = TokenCache.open(sharded)
    assert cache.layout == "sharded" and cache.num_shards == 2
    np.testing.assert_array_equal(np.concatenate(cache.read_rows(np.arange(120))), np.concatenate(rows))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_server_stopped_mid_run_is_a_named_error_in_the_consumer(
    object_stores, reference, monkeypatch, scheme
):
    """The server dies after the first batch: the consumer gets the batches made before (exact),
    then ``StoreUnavailableError`` within the bounded retries and read timeout; never zeros."""
    monkeypatch.setenv("MESHBATCH_READ_TIMEOUT_S", "20")
    server = GCSServer() if scheme == "gs" else S3Server()
    front = object_stores["gcs_front"]
    try:
        if scheme == "gs":
            front.retarget(server.port)  # TensorStore's GCS URL is the proxy, fixed per process
        else:
            monkeypatch.setenv("MESHBATCH_S3_ENDPOINT", server.url)
        remote = url(scheme)
        write(remote, docs())
        want = reference
        cache = TokenCache.open(remote, context=fast_failing_context())
        got = pipeline(cache)
        with got.iterate_from(0) as batches:
            np.testing.assert_array_equal(np.asarray(next(batches).tokens), np.asarray(want.batch(0).tokens))
            server.stop()
            began = time.monotonic()
            with pytest.raises(StoreUnavailableError, match=r"did not answer|no answer") as raised:
                for step in range(1, 50):  # batches made before the stop are served, and exact
                    tokens = np.asarray(next(batches).tokens)
                    np.testing.assert_array_equal(tokens, np.asarray(want.batch(step).tokens))
            assert time.monotonic() - began < 60, "the error must come within the bounded retries"
            assert f"{scheme}://" in str(raised.value) or "meshbatch" in str(raised.value)
            with pytest.raises(StoreUnavailableError):  # a failed step is never skipped
                next(batches)
    finally:
        server.stop()
        front.retarget(object_stores["gcs"].port)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_slow_jittery_server_gives_bit_identical_batches(object_stores, reference, monkeypatch, scheme):
    """20-200 ms per request with a 10% tail of up to 300 ms more: the same batches as local."""
    remote = url(scheme)
    write(remote, docs())
    target = object_stores["gcs"].port if scheme == "gs" else object_stores["s3"].port
    proxy = LatencyProxy(target, low=0.02, high=0.2, tail_p=0.1, tail_s=0.3, seed=5)
    try:
        if scheme == "gs":
            front = object_stores["gcs_front"]
            front.low, front.high, front.tail_p, front.tail_s = 0.02, 0.2, 0.1, 0.3
        else:
            monkeypatch.setenv("MESHBATCH_S3_ENDPOINT", proxy.url)
        cache = TokenCache.open(remote, context=ts.Context(store_context_spec(cache_bytes=64 << 20)))
        want, got = reference, pipeline(cache, prefetch=4)
        with got.iterate_from(0) as batches:
            for step in range(4):
                batch = next(batches)
                reference = want.batch(step)
                for field in ("tokens", "loss_mask", "segment_ids"):
                    np.testing.assert_array_equal(
                        np.asarray(getattr(batch, field)), np.asarray(getattr(reference, field))
                    )
            stats = got.stats()
        delays = object_stores["gcs_front"].delays if scheme == "gs" else proxy.delays
        assert len(delays) > 0 and max(delays) >= 0.02  # the requests really went through the delay
        assert stats["read_p50_s"] >= 0.02  # every batch of reads waited for at least one request
        # the context sized from what this stream measured opens the cache and reads the same
        spec = context_spec_from_stats(stats, batch_size=16)
        in_flight = stats["requests_per_example"] * 16 / stats["step_p50_s"] * stats["read_p99_s"]
        assert spec["gcs_request_concurrency"]["limit"] == min(max(int(2 * in_flight + 0.999), 32), 1024)
        assert spec["s3_request_retries"]["max_delay"] == f"{max(2.0, 10 * stats['read_p99_s'])}s"
        sized = pipeline(TokenCache.open(remote, context=ts.Context(spec)))
        np.testing.assert_array_equal(np.asarray(sized.batch(3).tokens), np.asarray(want.batch(3).tokens))
    finally:
        front = object_stores["gcs_front"]
        front.low, front.high, front.tail_p, front.tail_s = 0.0, 0.0, 0.0, 0.0
        proxy.stop()


def test_threads_share_block_reads_in_flight(object_stores, tmp_path):
    """Eight threads ask for the same blocks of a slow store at once: each block is read once."""
    rows = docs()
    remote, local = url("gs"), str(tmp_path / "cache")
    write(remote, rows)
    write(local, rows)
    front = object_stores["gcs_front"]
    front.low, front.high = 0.05, 0.05
    try:
        lru = BlockCache(1 << 24, block_tokens=4096)
        context = ts.Context(store_context_spec(cache_bytes=1 << 20))
        cache = TokenCache.open(remote, block_cache=lru, context=context)
        starts = np.random.default_rng(4).integers(0, cache.num_tokens - 300, 40)
        want = TokenCache.open(local).read_spans(starts, 300)
        got, barrier = [None] * 8, threading.Barrier(8, timeout=30)

        def read(i):
            barrier.wait()
            got[i] = cache.read_spans(starts, 300)

        threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        distinct = len({k for s in starts.tolist() for k in range(s // 4096, (s + 299) // 4096 + 1)})
        assert lru.stats()["misses"] == distinct  # no block read twice
        for result in got:
            for a, b in zip(result, want, strict=True):
                np.testing.assert_array_equal(a, b)
    finally:
        front.low, front.high = 0.0, 0.0


def test_context_sized_from_measured_latency():
    from meshbatch.cache.format.stores import sized_context_spec

    spec = sized_context_spec(
        read_latency_s=0.1, step_s=0.25, requests_per_step=400, bytes_per_step=4 << 20, depth=4
    )
    assert spec["gcs_request_concurrency"] == spec["s3_request_concurrency"] == {"limit": 320}
    assert spec["cache_pool"]["total_bytes_limit"] == 256 << 20
    assert spec["s3_request_retries"]["max_delay"] == "2.0s"
    ts.Context(spec)  # TensorStore accepts it
    low = sized_context_spec(read_latency_s=0.01, step_s=1, requests_per_step=1, bytes_per_step=1, depth=1)
    assert low["gcs_request_concurrency"] == {"limit": 32}
    with pytest.raises(ValueError, match="step_s must be > 0"):
        sized_context_spec(read_latency_s=0.1, step_s=0, requests_per_step=1, bytes_per_step=1, depth=1)
    with pytest.raises(ValueError, match="do not measure a stream yet"):
        context_spec_from_stats({}, batch_size=16)
