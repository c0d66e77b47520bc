"""A writer SIGKILLed at any instant loses no committed row, and the next run completes a clean cache.

The kill loop (``benchmarks/kill_loop.py``, 300 kills there) runs here with fewer kills over every
write path: consolidated and sharded caches resumed kill after kill, preblocked stores and
``chunk*.npy`` output rebuilt. The other tests pin the causes one by one.
"""

import fcntl
import importlib.util
import os
import struct
import sys

import numpy as np
import pytest

from meshbatch.cache import CacheWriter, TokenCache, validate_cache
from meshbatch.cache.format.arrays import open_field
from meshbatch.cache.format.files import remove_stale_lock_files

_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "benchmarks", "kill_loop.py")


def _kill_loop():
    spec = importlib.util.spec_from_file_location("kill_loop", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("kill_loop", module)
    spec.loader.exec_module(module)
    return module


def _check_loop(results: dict, kills: dict) -> None:
    assert {mode: r["problems"] for mode, r in results.items()} == {mode: [] for mode in kills}
    for mode, r in results.items():
        assert r["kills"] == kills[mode], mode
        assert r["completed"] >= 1, mode  # at least the last output completed and equals a clean build


def test_kill_loop_consolidated_and_sharded_caches(tmp_path):
    kills = {"consolidated": 15, "sharded": 15}
    results = _kill_loop().kill_loop(str(tmp_path), kills=kills, seed=19, max_delay=0.5)
    _check_loop(results, kills)
    assert results["consolidated"]["committed_checked"] > 0
    assert results["sharded"]["committed_checked"] > 0


@pytest.mark.slow  # every preblock run compiles its packing plan afresh (~5 s each on 2 cores)
def test_kill_loop_preblocked_store_and_npy(tmp_path):
    kills = {"preblock-zarr": 1, "preblock-npy": 1}
    _check_loop(_kill_loop().kill_loop(str(tmp_path), kills=kills, seed=19), kills)


def _write(path, rows, **kwargs):
    loop = _kill_loop()
    with CacheWriter(path, flush_tokens=400, **kwargs) as writer:
        writer.write(loop.doc(i) for i in range(rows))
    return writer


def test_a_stale_lock_file_longer_than_the_next_write_does_not_tear_the_shard(tmp_path):
    """A killed TensorStore write leaves ``c/0.__lock``; reused untruncated, it tore the offsets shard."""
    loop, path, clean = _kill_loop(), str(tmp_path / "c"), str(tmp_path / "clean")
    writer = CacheWriter(path, flush_tokens=400)
    writer.write(loop.doc(i) for i in range(300))
    writer.flush()
    for name in ("offsets", "data"):  # what a SIGKILL between write and rename leaves: a longer value
        shard = os.path.join(path, "input_ids", name, "c", "0")
        with open(shard, "rb") as f:
            stale = f.read()
        with open(shard + ".__lock", "wb") as f:
            f.write(stale + b"\x5a" * 4096)
    resumed = CacheWriter(path, if_exists="resume", flush_tokens=400)
    assert not any(n.endswith(".__lock") for n in os.listdir(os.path.join(path, "input_ids", "offsets", "c")))
    resumed.write(loop.doc(i) for i in range(300, 500))
    resumed.finish()
    _write(clean, 500)
    loop.check_equal("consolidated", path, clean)
    assert validate_cache(path, deep=True, progress=False).ok


def _hold_ofd_lock(fd: int) -> None:
    """An open-file-description write lock, as TensorStore takes while it writes a key."""
    flock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, flock)


def test_a_lock_file_a_live_writer_holds_is_kept(tmp_path):
    held, stale = tmp_path / "a" / "c" / "0.__lock", tmp_path / "b" / "0.__lock"
    for p in (held, stale):
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x" * 10)
    fd = os.open(held, os.O_WRONLY)
    try:
        _hold_ofd_lock(fd)
        assert remove_stale_lock_files(str(tmp_path)) == [os.path.join("b", "0.__lock")]
        assert held.exists() and not stale.exists()
    finally:
        os.close(fd)
    assert remove_stale_lock_files(str(tmp_path)) == [os.path.join("a", "c", "0.__lock")]


@pytest.mark.parametrize("advance_count", [False, True])
def test_values_a_killed_flush_wrote_past_the_commit_are_zeroed_on_resume(tmp_path, advance_count):
    """Killed after its data and offsets writes (and maybe offsets[0]) but before its ledger."""
    loop, path, clean = _kill_loop(), str(tmp_path / "c"), str(tmp_path / "clean")
    _write(clean, 120)
    writer = CacheWriter(path, flush_tokens=400)
    writer.write(loop.doc(i) for i in range(120))
    writer.flush()
    arrays = open_field(path, "input_ids", writable=True)
    rows, tokens = writer.rows, writer.tokens
    arrays.data[tokens : tokens + 70].write(np.full(70, 7, np.int32)).result()
    arrays.offsets[rows + 1 : rows + 4].write(tokens + np.array([30, 50, 70])).result()
    if advance_count:
        arrays.offsets[0].write(rows + 3).result()
    CacheWriter(path, if_exists="resume").finish()
    loop.check_equal("consolidated", path, clean)
    assert TokenCache.open(path).num_rows == 120


def test_a_file_url_cache_gets_the_stale_lock_and_temp_file_cleanup(tmp_path):
    """``file:///c`` is the local directory ``/c``: its leftovers are cleaned as a plain path's are."""
    loop, path, clean = _kill_loop(), str(tmp_path / "c"), str(tmp_path / "clean")
    writer = CacheWriter(f"file://{path}", flush_tokens=400)
    writer.write(loop.doc(i) for i in range(300))
    writer.flush()
    shard = os.path.join(path, "input_ids", "data", "c", "0")
    with open(shard, "rb") as f:  # a SIGKILL between TensorStore's write and its rename
        stale = f.read()
    with open(shard + ".__lock", "wb") as f:
        f.write(stale + b"\x5a" * 4096)
    dead_pid = 2**22 + 1  # above the default pid_max: no such process
    temp = os.path.join(path, f"shard_ledger.json.tmp-{dead_pid}-{'0' * 32}")
    with open(temp, "w") as f:
        f.write('{"total_num')
    resumed = CacheWriter(f"file://{path}", if_exists="resume", flush_tokens=400)
    assert not os.path.exists(shard + ".__lock") and not os.path.exists(temp)
    resumed.write(loop.doc(i) for i in range(300, 500))
    resumed.finish()
    _write(clean, 500)
    loop.check_equal("consolidated", path, clean)
    assert validate_cache(f"file://{path}", deep=True, progress=False).ok
