"""Symlinks inside a cache never lead a write, a delete or a read out of its root.

The policy (``meshbatch/cache/format/stores.py``): the cache root itself may be a symlink; a shard
directory, a field directory and the field's ``data`` / ``offsets`` must resolve strictly below the
resolved root, for writers (checked before anything is deleted or written) and readers alike.
"""

import os
import shutil

import numpy as np
import pytest

from meshbatch.cache import CacheIntegrityError, CacheWriter, ShardedCacheWriter, TokenCache, validate_cache

DEAD_PID = 2**22 + 1  # above the default pid_max: no such process


def _snapshot(root: str) -> dict[str, bytes]:
    out = {}
    for parent, _, names in os.walk(root):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _victim(path: str) -> dict[str, bytes]:
    """A directory outside every cache, holding files a cleanup or an overwrite would remove."""
    for rel in (
        "notes.txt",
        "data/precious.bin",
        "offsets/precious.bin",
        f"shard_ledger.json.tmp-{DEAD_PID}-{'0' * 32}",  # what remove_stale_temp_files deletes
        f"meshbatch_checksums.json.tmp-{DEAD_PID}-{'a' * 32}",
        "data/c/0.__lock",  # what remove_stale_lock_files deletes
    ):
        os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
        with open(os.path.join(path, rel), "w") as f:
            f.write("victim\n")
    return _snapshot(path)


def _rows(first: int, n: int = 3) -> list[np.ndarray]:
    return [np.arange(first + i, first + i + 4, dtype=np.int32) for i in range(n)]


def test_a_shard_symlinked_out_of_the_cache_is_never_written(tmp_path):
    root, outside = str(tmp_path / "c"), str(tmp_path / "outside")
    before = _victim(outside)
    writer = ShardedCacheWriter(root)
    writer.write_shard("part-0", _rows(0))  # killed before part-1, say
    os.symlink(outside, os.path.join(root, "part-1"))
    resumed = ShardedCacheWriter(root, if_exists="resume")
    resumed.write_shard("part-0", None)
    with pytest.raises(
        CacheIntegrityError, match=r"shard 'part-1' at .*/c/part-1 resolves to .*/outside, not inside"
    ):
        resumed.write_shard("part-1", _rows(10))
    assert _snapshot(outside) == before
    assert [r.tolist() for r in TokenCache.open(root, require_finished=False).read_rows([0, 1, 2])] == [
        r.tolist() for r in _rows(0)
    ]


@pytest.mark.parametrize("linked", ["input_ids", "input_ids/data", "input_ids/offsets"])
@pytest.mark.parametrize("if_exists", ["overwrite", "resume", "error"])
@pytest.mark.parametrize("url", [False, True])
def test_a_field_symlinked_out_of_the_cache_is_never_emptied(tmp_path, linked, if_exists, url):
    """``if_exists="overwrite"`` deleted the files a symlinked field (or its data) led to."""
    root, outside = str(tmp_path / "c"), str(tmp_path / "outside")
    with CacheWriter(root, flush_tokens=1) as w:
        w.write(_rows(0))
    before = _victim(outside)
    shutil.rmtree(os.path.join(root, linked))
    os.symlink(outside, os.path.join(root, linked))
    with pytest.raises(CacheIntegrityError, match=r"resolves to .*/outside, not inside the cache root"):
        CacheWriter(f"file://{root}" if url else root, if_exists=if_exists)
    assert _snapshot(outside) == before


def test_a_reader_refuses_a_part_symlinked_out_of_the_cache(tmp_path):
    """Reads obey the same rule: a symlink out would serve another directory's tokens as this cache's."""
    sharded, consolidated = str(tmp_path / "s"), str(tmp_path / "c")
    writer = ShardedCacheWriter(sharded)
    writer.write_shard("p0", _rows(0))
    writer.write_shard("p1", _rows(100))
    writer.finish()
    with CacheWriter(consolidated) as w:
        w.write(_rows(0))
    for root, part in ((sharded, "p1"), (consolidated, "input_ids"), (sharded, "p0/input_ids/data")):
        moved = str(tmp_path / "elsewhere" / part.replace("/", "_"))
        shutil.move(os.path.join(root, part), moved)
        os.symlink(moved, os.path.join(root, part))
        with pytest.raises(CacheIntegrityError, match=f"at {root}/{part} resolves to {moved}, not inside"):
            TokenCache.open(root)
        report = validate_cache(root)
        assert not report.ok and f"{root}/{part} resolves to {moved}" in report.error
        os.unlink(os.path.join(root, part))
        shutil.move(moved, os.path.join(root, part))
        assert validate_cache(root, deep=True, progress=False).ok


def test_two_shards_one_directory_through_a_symlink_are_refused(tmp_path):
    root = str(tmp_path / "c")
    writer = ShardedCacheWriter(root)
    writer.write_shard("p0", _rows(0))
    writer.write_shard("p1", _rows(100))
    writer.finish()
    shutil.rmtree(os.path.join(root, "p1"))
    os.symlink(os.path.join(root, "p0"), os.path.join(root, "p1"))  # stays inside, aliases p0
    with pytest.raises(CacheIntegrityError, match="shards 'p0' and 'p1' are one directory"):
        TokenCache.open(root)


def test_a_symlinked_cache_root_and_symlinks_that_stay_inside_are_allowed(tmp_path):
    """A whole cache on another disk is a symlink to its root; only components inside are checked."""
    disk2, link = tmp_path / "disk2" / "c", str(tmp_path / "c")
    disk2.mkdir(parents=True)
    os.symlink(disk2, link)
    writer = CacheWriter(link, flush_tokens=1)
    writer.write(_rows(0))
    writer.flush()
    resumed = CacheWriter(f"file://{link}", if_exists="resume")
    resumed.write(_rows(50))
    resumed.finish()
    assert TokenCache.open(link).num_rows == 6 and validate_cache(link, deep=True, progress=False).ok

    sharded = str(tmp_path / "s")
    writer = ShardedCacheWriter(sharded)
    os.makedirs(os.path.join(sharded, "real"))
    os.symlink(os.path.join(sharded, "real"), os.path.join(sharded, "sub"))  # inside the root
    writer.write_shard("sub/p0", _rows(0))
    writer.write_shard("p1", _rows(100))
    writer.finish()
    assert os.path.isdir(os.path.join(sharded, "real", "p0", "input_ids"))
    cache = TokenCache.open(sharded)
    assert [r.tolist() for r in cache.read_rows(range(6))] == [r.tolist() for r in _rows(0) + _rows(100)]
