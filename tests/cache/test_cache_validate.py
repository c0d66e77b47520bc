"""Each validation failure produces its clear error on open, and ``meshbatch validate-cache`` reports it."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorstore as ts
from corpora import edit_ledger

from meshbatch.cache import CacheIntegrityError, CacheWriter, ShardedCacheWriter, TokenCache, validate_cache
from meshbatch.cli import main

DOCS = [np.arange(n, dtype=np.int32) + 100 * n for n in (5, 3, 0, 7, 2, 4)]


def _write(path, docs=DOCS, dtype="int32") -> str:
    with CacheWriter(str(path), dtype=dtype) as writer:
        writer.write(docs)
    return str(path)


def _array(path, *parts) -> ts.TensorStore:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(path, *parts)}}
    return ts.open(spec, open=True).result()


def assert_open_refused(path: str, error: type[Exception], match: str) -> None:
    """Opening the cache at ``path`` raises ``error`` with a message matching ``match``."""
    with pytest.raises(error, match=match):
        TokenCache.open(path)


def test_good_cache_passes(tmp_path):
    cache = TokenCache.open(_write(tmp_path))
    assert (cache.num_rows, cache.num_tokens, cache.is_finished) == (6, 21, True)
    np.testing.assert_array_equal(cache.doc_lengths(), [5, 3, 0, 7, 2, 4])


def test_missing_ledger(tmp_path):
    path = _write(tmp_path)
    os.unlink(os.path.join(path, "shard_ledger.json"))
    with pytest.raises(FileNotFoundError, match=f"no ledger at {path}/shard_ledger.json"):
        TokenCache.open(path)


def test_unfinished_ledger(tmp_path):
    writer = CacheWriter(str(tmp_path))
    writer.write(DOCS)
    writer.flush()
    with pytest.raises(ValueError, match=r"is not finished \(ledger is_finished=false, 6 rows committed\)"):
        TokenCache.open(str(tmp_path))
    assert TokenCache.open(str(tmp_path), require_finished=False).num_rows == 6


@pytest.mark.parametrize("array", ["data", "offsets"])
def test_missing_zarr_metadata(tmp_path, array):
    path = _write(tmp_path)
    os.unlink(os.path.join(path, "input_ids", array, "zarr.json"))
    with pytest.raises(FileNotFoundError, match=f"missing zarr metadata {path}/input_ids/{array}/zarr.json"):
        TokenCache.open(path)


def test_missing_field(tmp_path):
    path = _write(tmp_path)
    with pytest.raises(
        FileNotFoundError, match=f"missing zarr metadata {path}/attention_mask/offsets/zarr.json"
    ):
        TokenCache.open(path, field="attention_mask")


def test_offsets_not_monotone(tmp_path):
    path = _write(tmp_path)
    _array(path, "input_ids", "offsets")[4].write(6).result()  # row 3 now ends at 6 but starts at 8
    assert_open_refused(path, ValueError, r"input_ids/offsets not monotone: row 3 spans \[8, 6\)")


def test_offsets_beyond_ledger_token_count(tmp_path):
    path = _write(tmp_path)
    _array(path, "input_ids", "offsets")[6].write(25).result()
    assert_open_refused(
        path, ValueError, "input_ids/offsets reach token 25, but the ledger records 21 tokens"
    )


def test_offsets_beyond_stored_data(tmp_path):
    path = _write(tmp_path)
    edit_ledger(path, field_counts={})  # as the installed Levanter writes it: no token count to compare
    _array(path, "input_ids", "offsets")[6].write(2**27 + 5).result()
    assert_open_refused(
        path,
        CacheIntegrityError,
        r"reach token 134217733, but the data chunk holding token 134217732 cannot be read: NOT_FOUND",
    )


def test_offsets_into_deleted_data_chunks(tmp_path):
    path = _write(tmp_path)
    os.unlink(os.path.join(path, "input_ids", "data", "c", "0"))
    assert_open_refused(
        path,
        CacheIntegrityError,
        r"reach token 21, but the data chunk holding token 20 cannot be read: NOT_FOUND",
    )


def test_row_count_disagrees_with_offsets(tmp_path):
    path = _write(tmp_path)
    edit_ledger(path, total_num_rows=7)
    assert_open_refused(path, ValueError, "offsets\\[0\\] = 6 rows on disk, but the ledger commits 7 rows")


def test_dtype_mismatch_with_expected(tmp_path):
    path = _write(tmp_path, dtype="uint16")
    assert TokenCache.open(path).dtype == np.uint16  # the on-disk dtype wins
    with pytest.raises(ValueError, match="input_ids/data has dtype uint16, expected int32"):
        TokenCache.open(path, dtype="int32")


def test_dtype_mismatch_between_shards(tmp_path):
    writer = ShardedCacheWriter(str(tmp_path))
    writer.write_shard("a", iter(DOCS))
    writer.finish()
    _write(tmp_path / "b", dtype="uint16")
    edit_ledger(
        str(tmp_path),
        finished_shards=["a", "b"],
        shard_rows={"a": 6, "b": 6},
        total_num_rows=12,
        field_counts={"input_ids": 42},
        field_counts_by_shard={"a": {"input_ids": 21}, "b": {"input_ids": 21}},
    )
    with pytest.raises(ValueError, match=f"{tmp_path}/b/input_ids/data has dtype uint16, expected int32"):
        TokenCache.open(str(tmp_path))


def test_offsets_must_be_int64_and_data_integer(tmp_path):
    path = _write(tmp_path)
    kv = {"driver": "file", "path": os.path.join(path, "input_ids", "data")}
    ts.open(
        {"driver": "zarr3", "kvstore": kv}, create=True, delete_existing=True, dtype=ts.float32, shape=[30]
    ).result()
    assert_open_refused(path, ValueError, "input_ids/data has dtype float32; token data must be integers")
    kv["path"] = os.path.join(path, "input_ids", "offsets")
    ts.open(
        {"driver": "zarr3", "kvstore": kv}, create=True, delete_existing=True, dtype=ts.int32, shape=[8]
    ).result()
    assert_open_refused(path, ValueError, "input_ids/offsets has dtype int32; Levanter caches use int64")


@pytest.fixture
def sharded(tmp_path):
    writer = ShardedCacheWriter(str(tmp_path))
    writer.write_shard("p0", iter(DOCS[:3]))
    writer.write_shard("p1", iter(DOCS[3:]))
    writer.finish()
    return str(tmp_path)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"finished_shards": ["/abs/p0", "p1"]},
            "shard path must be a relative subdirectory \\(got '/abs/p0'\\)",
        ),
        ({"finished_shards": ["gs://b/p0", "p1"]}, "must be a relative subdirectory \\(got 'gs://b/p0'\\)"),
        ({"finished_shards": ["../p0", "p1"]}, "must be a relative subdirectory \\(got '../p0'\\)"),
        ({"finished_shards": ["p0", "p0"]}, "lists shard 'p0' twice"),
        ({"shard_rows": {"p1": 3}}, "no shard_rows entry \\(row count\\) for shard 'p0'"),
        ({"total_num_rows": 7}, "row count mismatch: sum of finished shard rows = 6, total_num_rows = 7"),
        (
            {"field_counts_by_shard": {"p1": {"input_ids": 13}}},
            "no field_counts_by_shard\\['p0'\\]\\['input_ids'\\]",
        ),
        (
            {
                "field_counts_by_shard": {
                    "p0": {"input_ids": 8},
                    "p1": {"input_ids": 13},
                    "p9": {"input_ids": 1},
                }
            },
            "field_counts_by_shard for unknown shards \\['p9'\\]",
        ),
        ({"field_counts": {"input_ids": 20}}, "input_ids count mismatch: sum over shards = 21"),
        ({"layout": "striped"}, "layout='striped'; expected 'consolidated' or 'sharded'"),
    ],
)
def test_bad_sharded_ledgers(sharded, changes, message):
    edit_ledger(sharded, **changes)
    with pytest.raises(ValueError, match=message):
        TokenCache.open(sharded)


def test_shard_offsets_disagree_with_its_ledger_counts(sharded):
    edit_ledger(
        sharded,
        field_counts_by_shard={"p0": {"input_ids": 9}, "p1": {"input_ids": 12}},
        field_counts={"input_ids": 21},
    )
    with pytest.raises(
        ValueError, match=f"{sharded}/p0/input_ids/offsets reach token 8, but the ledger records 9"
    ):
        TokenCache.open(sharded)


def test_validate_cache_report_and_cli(tmp_path, capsys):
    good, bad = _write(tmp_path / "good"), _write(tmp_path / "bad")
    _array(bad, "input_ids", "offsets")[4].write(6).result()

    report = validate_cache(good)
    assert report.ok and (report.num_rows, report.num_tokens, report.dtype) == (6, 21, "int32")
    assert main(["validate-cache", good]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK {good}") and "rows        6" in out

    assert not validate_cache(bad).ok
    assert main(["validate-cache", bad]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"INVALID {bad}") and "not monotone: row 3 spans [8, 6)" in out


def test_python_dash_m_validate_cache(tmp_path):
    path = str(tmp_path / "missing")
    run = subprocess.run(
        [sys.executable, "-m", "meshbatch", "validate-cache", path],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert f"no ledger at {path}/shard_ledger.json" in run.stdout


def test_tensorstore_url_paths_open_the_same_cache(tmp_path):
    path = _write(tmp_path)
    by_url = TokenCache.open(f"file://{path}")
    np.testing.assert_array_equal(by_url.doc_offsets(), TokenCache.open(path).doc_offsets())
    np.testing.assert_array_equal(by_url.read_rows([3])[0], DOCS[3])
