"""Round trips with Levanter, both ways, for the consolidated and the sharded layout."""

import json
import os

import numpy as np
import pytest
from levanter.store.cache import CacheLedger, SerialCacheWriter, TreeCache

from meshbatch.cache import CacheWriter, ShardedCacheWriter, TokenCache


def _docs(seed: int, n: int, dtype=np.int32, vocab: int = 50_000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(0, 300)), dtype=dtype) for _ in range(n)]


def _levanter_write(path: str, docs: list[np.ndarray], batch: int = 64) -> None:
    exemplar = {"input_ids": np.zeros((0,), dtype=docs[0].dtype)}
    with SerialCacheWriter(path, exemplar) as writer:
        for i in range(0, len(docs), batch):
            writer.write_batch([{"input_ids": d} for d in docs[i : i + batch]])


def _levanter_rows(path: str, dtype) -> list[np.ndarray]:
    cache = TreeCache.load(path, {"input_ids": np.zeros((0,), dtype=dtype)})
    if len(cache) == 0:  # Levanter's get_batch_sync cannot take an empty batch
        return []
    return [row["input_ids"] for row in cache.get_batch_sync(list(range(len(cache))))]


def _write_levanter_sharded(root: str, shards: list[list[np.ndarray]]) -> list[str]:
    """Levanter-written shards plus the top-level ledger newer Levanter writes for them."""
    names = [f"part-{i:05d}-of-{len(shards):05d}" for i in range(len(shards))]
    for name, docs in zip(names, shards, strict=True):
        _levanter_write(os.path.join(root, name), docs)
    counts = {
        name: {"input_ids": int(sum(d.size for d in docs))} for name, docs in zip(names, shards, strict=True)
    }
    ledger = {
        "total_num_rows": sum(len(d) for d in shards),
        "shard_rows": {name: len(docs) for name, docs in zip(names, shards, strict=True)},
        "is_finished": True,
        "finished_shards": names,
        "field_counts": {"input_ids": sum(c["input_ids"] for c in counts.values())},
        "field_counts_by_shard": counts,
        "layout": "sharded",
        "metadata": {"preprocessor_metadata": None},
    }
    with open(os.path.join(root, "shard_ledger.json"), "w") as f:
        json.dump(ledger, f)
    return names


def _assert_rows_equal(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype, i
        np.testing.assert_array_equal(g, e, err_msg=f"row {i}")


@pytest.mark.parametrize("dtype", [np.int32, np.uint16])
def test_levanter_written_cache_reads_back_identically(tmp_path, dtype):
    docs = _docs(0, 500, dtype=dtype, vocab=60_000)
    _levanter_write(str(tmp_path), docs)
    cache = TokenCache.open(str(tmp_path))

    assert (cache.layout, cache.num_rows, cache.dtype, cache.is_finished) == (
        "consolidated",
        500,
        dtype,
        True,
    )
    np.testing.assert_array_equal(cache.doc_lengths(), [d.size for d in docs])
    _assert_rows_equal(cache.read_rows(np.arange(500)), docs)
    np.testing.assert_array_equal(cache.read_spans([0], [cache.num_tokens])[0], np.concatenate(docs))


@pytest.mark.parametrize("dtype", [np.int32, np.uint16])
def test_meshbatch_written_cache_loads_in_levanter(tmp_path, dtype):
    docs = _docs(1, 500, dtype=dtype, vocab=60_000)
    with CacheWriter(str(tmp_path), dtype=dtype, flush_tokens=10_000) as writer:
        writer.write(docs)

    _assert_rows_equal(_levanter_rows(str(tmp_path), dtype), docs)
    ledger = CacheLedger.load(str(tmp_path))
    assert (ledger.is_finished, ledger.total_num_rows) == (True, 500)


def test_meshbatch_zarr_metadata_is_levanters(tmp_path):
    _levanter_write(str(tmp_path / "levanter"), _docs(2, 3))
    with CacheWriter(str(tmp_path / "ours")) as writer:
        writer.write(_docs(2, 3))
    for array in ("offsets", "data"):
        with open(tmp_path / "levanter" / "input_ids" / array / "zarr.json") as f:
            theirs = json.load(f)
        with open(tmp_path / "ours" / "input_ids" / array / "zarr.json") as f:
            assert json.load(f) == theirs


def test_levanter_written_sharded_cache_reads_back_identically(tmp_path):
    shards = [_docs(10, 40), _docs(11, 1), _docs(12, 75)]
    _write_levanter_sharded(str(tmp_path), shards)
    cache = TokenCache.open(str(tmp_path))
    docs = [d for shard in shards for d in shard]

    assert (cache.layout, cache.num_shards, cache.num_rows) == ("sharded", 3, 116)
    assert cache.num_tokens == sum(d.size for d in docs)
    _assert_rows_equal(cache.read_rows(np.arange(116)), docs)
    # one span over every shard boundary: the global token space is the shards back to back
    flat = np.concatenate(docs)
    cache.counters.reset()
    np.testing.assert_array_equal(cache.read_spans([0], [flat.size])[0], flat)
    assert cache.counters.runs == 1 and cache.counters.reads_issued == 3


def test_meshbatch_written_sharded_cache_loads_in_levanter(tmp_path):
    shards = [_docs(20, 30), [], _docs(21, 50)]
    names = ["part-a", "sub/part-b", "part-c"]
    writer = ShardedCacheWriter(str(tmp_path))
    for name, docs in zip(names, shards, strict=True):
        writer.write_shard(name, iter(docs))
    writer.finish()

    with open(tmp_path / "shard_ledger.json") as f:
        top = json.load(f)
    assert set(top) == {
        "total_num_rows",
        "shard_rows",
        "is_finished",
        "finished_shards",
        "field_counts",
        "field_counts_by_shard",
        "layout",
        "metadata",
        "cache_id",  # meshbatch's own key: Levanter ignores it
    }
    assert (top["layout"], top["finished_shards"], top["total_num_rows"]) == ("sharded", names, 80)
    assert top["field_counts_by_shard"]["sub/part-b"] == {"input_ids": 0}
    assert CacheLedger.load(str(tmp_path)).total_num_rows == 80  # the installed Levanter parses it

    levanter_rows = [row for name in names for row in _levanter_rows(str(tmp_path / name), np.int32)]
    docs = [d for shard in shards for d in shard]
    _assert_rows_equal(levanter_rows, docs)
    _assert_rows_equal(TokenCache.open(str(tmp_path)).read_rows(np.arange(80)), docs)


def test_sharded_and_consolidated_caches_of_the_same_rows_read_the_same(tmp_path):
    docs = _docs(30, 90)
    with CacheWriter(str(tmp_path / "one")) as writer:
        writer.write(docs)
    sharded = ShardedCacheWriter(str(tmp_path / "many"))
    for i in range(0, 90, 20):
        sharded.write_shard(f"s{i}", iter(docs[i : i + 20]))
    sharded.finish()
    one, many = TokenCache.open(str(tmp_path / "one")), TokenCache.open(str(tmp_path / "many"))

    np.testing.assert_array_equal(one.doc_offsets(), many.doc_offsets())
    rng = np.random.default_rng(0)
    starts = rng.integers(0, one.num_tokens - 500, size=64)
    lengths = rng.integers(0, 500, size=64)
    a, b = one.read_spans(starts, lengths), many.read_spans(starts, lengths)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.offsets, b.offsets)
