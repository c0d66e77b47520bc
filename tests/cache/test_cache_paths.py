"""No write outside the cache: every field and shard name is one path component; shard names are unique;
a shard replaced under an open reader is a ``CacheChangedError``, never its new rows."""

import json
import os
import shutil

import numpy as np
import pytest

from meshbatch.cache import (
    CacheChangedError,
    CacheIntegrityError,
    CacheWriter,
    ShardedCacheWriter,
    TokenCache,
    build_cache,
    validate_cache,
)
from meshbatch.cli import main

HOSTILE = ["..", "../../x", ".", "a/b", "/abs", "..\\x", "a\0b", ""]
HOSTILE_SHARDS = ["..", "../../x", ".", "a/../b", "a//b", "sub/..", "/abs", "..\\x", "a\0b", ""]


def _tree(root) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files
    }


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_field_and_shard_names_write_nothing(tmp_path, name):
    (tmp_path / "in.txt").write_text("hello\n")
    before = _tree(tmp_path)
    root = str(tmp_path / "deep" / "cache")
    with pytest.raises(ValueError, match="field") as e:
        CacheWriter(root, field=name)
    assert repr(name) in str(e.value) or name == ""
    with pytest.raises(ValueError, match="field"):
        ShardedCacheWriter(root, field=name)
    with pytest.raises(ValueError, match="field"):
        build_cache(root, [str(tmp_path / "in.txt")], field=name)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("name", HOSTILE_SHARDS)
def test_hostile_shard_names_write_nothing(tmp_path, name):
    """A shard name may be a relative path (``sub/part-1``) but never leaves the cache."""
    writer = ShardedCacheWriter(str(tmp_path / "deep" / "sharded"))
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match="name") as e:
        writer.write_shard(name, [np.arange(3, dtype=np.int32)])
    assert repr(name) in str(e.value)
    assert _tree(tmp_path) == before


def test_cli_field_dotdot_is_one_line_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("hello\n")
    before = _tree(tmp_path)
    code = main(
        ["build-cache", str(tmp_path / "c"), str(tmp_path / "in.txt"), "--field", "..", "--no-progress"]
    )
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "field must be a single path component" in err
    assert "Traceback" not in err and "'..'" in err
    assert _tree(tmp_path) == before


def _rows(n: int, first: int = 0) -> list[np.ndarray]:
    return [np.arange(first + i, first + i + 3 + i % 4, dtype=np.int32) for i in range(n)]


def test_a_shard_name_written_twice_is_refused(tmp_path):
    writer = ShardedCacheWriter(str(tmp_path))
    writer.write_shard("dup", _rows(5))
    with pytest.raises(
        ValueError, match=r"shard 'dup' is already written .* write_shard\(name='dup'\) twice"
    ):
        writer.write_shard("dup", _rows(5, 100))
    writer.write_shard("other", _rows(2))
    assert writer.finish().finished_shards == ("dup", "other")


def test_a_resumed_writer_skips_a_finished_shard_once(tmp_path):
    writer = ShardedCacheWriter(str(tmp_path))
    writer.write_shard("s0", _rows(5))  # killed here, say
    resumed = ShardedCacheWriter(str(tmp_path), if_exists="resume")
    assert resumed.write_shard("s0", _rows(5)) == 5  # finished by the earlier run: skipped
    with pytest.raises(ValueError, match="already written"):
        resumed.write_shard("s0", _rows(5))
    resumed.write_shard("s1", _rows(3, 50))
    resumed.finish()
    cache = TokenCache.open(str(tmp_path))
    assert [r.tolist() for r in cache.read_rows(np.arange(8))] == [
        r.tolist() for r in _rows(5) + _rows(3, 50)
    ]


@pytest.mark.parametrize("how", ["overwrite", "copy"])
def test_a_shard_replaced_under_an_open_reader_is_detected(tmp_path, how):
    root = str(tmp_path / "c")
    writer = ShardedCacheWriter(root)
    writer.write_shard("s0", _rows(30))
    writer.write_shard("s1", _rows(30, 1000))
    writer.finish()
    reader = TokenCache.open(root)
    first = [r.tolist() for r in reader.read_rows(np.arange(60))]
    if how == "overwrite":
        with CacheWriter(os.path.join(root, "s1"), if_exists="overwrite") as w:
            w.write(_rows(30, 5000))
    else:
        other = str(tmp_path / "other")
        with CacheWriter(other) as w:
            w.write(_rows(30, 5000))
        shutil.rmtree(os.path.join(root, "s1"))
        shutil.copytree(other, os.path.join(root, "s1"))
    with pytest.raises(CacheChangedError, match="shard 's1' was replaced"):
        reader.read_rows(np.arange(30, 60))
    assert [r.tolist() for r in TokenCache.open(root).read_rows(np.arange(30))] == first[:30]


@pytest.mark.parametrize("name", [*HOSTILE, "../other/input_ids"])
def test_a_reader_takes_the_field_as_one_path_component(tmp_path, name):
    """``field`` is joined to the cache root when reading too: ``'../other/input_ids'`` would read
    the tokens of the cache next door as this cache's."""
    root, other = str(tmp_path / "c"), str(tmp_path / "other")
    for path, token in ((root, 1), (other, 42)):
        with CacheWriter(path) as w:
            w.write([np.full(10, token, dtype=np.int32)])
    with pytest.raises(ValueError, match="field") as e:
        TokenCache.open(root, field=name)
    assert repr(name) in str(e.value)
    with pytest.raises(ValueError, match="field"):
        validate_cache(root, field=name)
    assert main(["validate-cache", root, "--field", name]) == 1


def _sharded_with_names(root: str, names: list[str]) -> str:
    """A sharded cache of one shard ``p0`` whose ledger lists it under each of ``names``."""
    writer = ShardedCacheWriter(root)
    writer.write_shard("p0", [np.arange(5, dtype=np.int32)])
    writer.finish()
    ledger = os.path.join(root, "shard_ledger.json")
    with open(ledger) as f:
        raw = json.load(f)
    raw.update(
        finished_shards=names,
        total_num_rows=len(names),
        shard_rows={n: 1 for n in names},
        field_counts_by_shard={n: {"input_ids": 5} for n in names},
        field_counts={"input_ids": 5 * len(names)},
    )
    with open(ledger, "w") as f:
        json.dump(raw, f)
    return ledger


@pytest.mark.parametrize(
    "names, bad", [(["p0", "./p0"], "./p0"), (["p0", "p0/"], "p0/"), (["p0", ".//p0"], ".//p0")]
)
def test_shard_names_that_alias_one_directory_are_refused(tmp_path, names, bad):
    """``'./p0'``, ``'p0/'`` and ``'.//p0'`` all name ``p0``: listed beside it, its rows were served twice."""
    root = str(tmp_path / "c")
    ledger = _sharded_with_names(root, names)
    with pytest.raises(CacheIntegrityError, match="shard path must be a relative subdirectory") as e:
        TokenCache.open(root)
    assert repr(bad) in str(e.value) and ledger in str(e.value)
    assert not validate_cache(root).ok


def test_shard_names_listed_twice_are_refused_naming_the_ledger(tmp_path):
    root = str(tmp_path / "c")
    ledger = _sharded_with_names(root, ["p0", "p0"])
    with pytest.raises(CacheIntegrityError, match=f"sharded ledger {ledger} lists shard 'p0' twice"):
        TokenCache.open(root)
