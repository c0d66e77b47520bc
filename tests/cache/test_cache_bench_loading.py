"""The loading benchmark's harness on a tiny cache: sequential access, read counting on both sides."""

import importlib.util
import json
import os
import sys

import numpy as np

from meshbatch.cache import TokenCache

_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "benchmarks", "bench_loading.py")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_loading", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_loading"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_sequential_rows_and_reads(tmp_path):
    bench, out, cache = _bench(), tmp_path / "out.json", str(tmp_path / "cache")
    args = ["--examples", "48", "--seq-len", "32", "--batch-sizes", "8,16", "--patterns", "sequential"]
    result = bench.main([*args, "--repeats", "1", "--cache", cache, "--out", str(out)])

    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert TokenCache.open(cache).num_tokens == 48 * 32
    assert [(r["name"], r["batch"]) for r in result["rows"]] == [("sequential", 8), ("sequential", 16)]
    for row in result["rows"]:
        assert row["tokens_match"]  # batch 0 read by both sides is identical
        assert row["ours_reads_per_example"] == 1 / row["batch"]  # one coalesced run per batch
        assert row["levanter_reads_per_example"] == 1.0  # TokenSeqDataset: one read per example
        assert row["ours_tokens_per_s"] > 0 and row["levanter_tokens_per_s"] > 0
    assert result["raw_ceiling_tokens_per_s"] > 0


def test_cache_is_reused_only_for_the_same_shape(tmp_path):
    bench, path = _bench(), str(tmp_path)
    bench.build_cache(path, examples=4, seq_len=8)
    first = TokenCache.open(path).read_spans([0], [32]).tokens.copy()
    mtime = os.path.getmtime(os.path.join(path, "shard_ledger.json"))
    bench.build_cache(path, examples=4, seq_len=8)
    assert os.path.getmtime(os.path.join(path, "shard_ledger.json")) == mtime
    bench.build_cache(path, examples=5, seq_len=8)
    cache = TokenCache.open(path)
    assert cache.num_tokens == 40
    np.testing.assert_array_equal(cache.read_spans([0], [32]).tokens, first)  # same seed, same prefix


def test_shuffled_patterns_read_the_same_examples_as_levanter(tmp_path):
    bench = _bench()
    args = ["--examples", "96", "--seq-len", "16", "--batch-sizes", "4,32", "--patterns", "full,era,block"]
    args += ["--era-length", "24", "--io-block-sizes", "4", "--window-blocks", "2", "--repeats", "1"]
    result = bench.main([*args, "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out.json")])

    assert {(r["kind"], r["batch"]) for r in result["rows"]} == {
        (k, b) for k in ("full", "era", "block") for b in (4, 32)
    }
    for row in result["rows"]:
        # compat="levanter" shuffles pick Levanter's physical examples: batch 0 is token-identical
        assert row["tokens_match"], row["name"]
        assert row["levanter_reads_per_example"] == 1.0
        assert 0 < row["ours_reads_per_example"] <= 1.0
        assert row["block_cache"] == (row["kind"] == "block" and row["batch"] < 8)
        full = next(r for r in result["rows"] if r["kind"] == "full" and r["batch"] == row["batch"])
        assert row["ratio_vs_levanter_full"] == row["ours_tokens_per_s"] / full["levanter_tokens_per_s"]
