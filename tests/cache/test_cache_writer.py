"""CacheWriter: commit order, a killed writer never reads as finished, resume, if_exists, sharded resume."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from levanter.store.cache import TreeCache

from meshbatch.cache import CacheWriter, ShardedCacheWriter, TokenCache, validate_cache
from meshbatch.cache.write import writer as writer_module


def doc(i: int) -> np.ndarray:
    """Row i of every cache in this file: deterministic, of varying length (0..49)."""
    return (np.arange(i % 50, dtype=np.int32) * 7 + i) % 30_000


def _assert_rows(path: str, n: int) -> None:
    cache = TokenCache.open(path, require_finished=False)
    assert cache.num_rows == n
    for i, row in enumerate(cache.read_rows(np.arange(n))):
        np.testing.assert_array_equal(row, doc(i), err_msg=f"row {i}")


_CHILD = textwrap.dedent(
    """
    import sys
    from meshbatch.cache import CacheWriter
    from test_cache_writer import doc

    writer = CacheWriter(sys.argv[1], flush_tokens=200)
    reported = False
    for i in range(10**7):  # far more than it gets to write: it is killed mid-stream
        writer.write([doc(i)])
        if not reported and writer.rows >= 300:
            print(writer.rows, flush=True)
            reported = True
    """
)


def test_killed_writer_never_reads_as_finished_and_resumes(tmp_path):
    path = str(tmp_path / "cache")
    here = os.path.dirname(__file__)  # the child imports this module, and it the shared helpers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.path.dirname(here)])}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE, text=True, env=env)
    try:
        reported = int(child.stdout.readline())  # the child has committed at least this many rows
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert reported >= 300 and child.returncode == -signal.SIGKILL

    with pytest.raises(ValueError, match="is not finished"):
        TokenCache.open(path)
    with pytest.raises(FileNotFoundError, match="not finished"):
        TreeCache.load(path, {"input_ids": np.zeros((0,), np.int32)})
    assert not validate_cache(path).ok
    committed = TokenCache.open(path, require_finished=False).num_rows
    assert committed >= reported
    _assert_rows(path, committed)  # every committed row is complete and correct

    with CacheWriter(path, if_exists="resume", flush_tokens=200) as writer:
        assert writer.num_rows == committed
        writer.write(doc(i) for i in range(committed, committed + 400))
    total = committed + 400
    _assert_rows(path, total)
    levanter = TreeCache.load(path, {"input_ids": np.zeros((0,), np.int32)})
    assert len(levanter) == total
    np.testing.assert_array_equal(levanter[total - 1]["input_ids"], doc(total - 1))


def test_rows_written_past_the_last_commit_are_invisible_and_truncated(tmp_path, monkeypatch):
    path = str(tmp_path)
    writer = CacheWriter(path)
    writer.write(doc(i) for i in range(10))
    writer.flush()
    # crash after data, offsets and offsets[0] are written but before the ledger commit
    monkeypatch.setattr(
        writer_module, "write_ledger", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    writer.write(doc(i) for i in range(100, 105))
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    monkeypatch.undo()

    offsets = writer._arrays.offsets
    assert int(offsets[0].read().result()) == 15  # Levanter's row count already counts them
    reader = TokenCache.open(path, require_finished=False)
    assert reader.num_rows == 10  # the ledger does not
    _assert_rows(path, 10)

    resumed = CacheWriter(path, if_exists="resume")
    assert resumed.num_rows == 10 and resumed.tokens == sum(doc(i).size for i in range(10))
    assert int(offsets[0].read().result()) == 10
    np.testing.assert_array_equal(offsets[11:16].read().result(), 0)  # stale offsets zeroed
    stale_end = resumed.tokens + sum(doc(i).size for i in range(100, 105))
    np.testing.assert_array_equal(resumed._arrays.data[resumed.tokens : stale_end].read().result(), 0)
    resumed.write(doc(i) for i in range(10, 20))
    resumed.finish()
    _assert_rows(path, 20)


def test_if_exists_modes(tmp_path):
    path = str(tmp_path)
    with CacheWriter(path) as writer:
        writer.write([doc(1), doc(2)])
    with pytest.raises(FileExistsError, match=f"a cache already exists at {path}"):
        CacheWriter(path)
    with pytest.raises(ValueError, match="is already finished \\(2 rows\\)"):
        CacheWriter(path, if_exists="resume")

    writer = CacheWriter(path, if_exists="overwrite")
    # the old finished ledger is gone before any new row is written
    assert TokenCache.open(path, require_finished=False).is_finished is False
    assert TokenCache.open(path, require_finished=False).num_rows == 0
    writer.write([doc(5)])
    writer.finish()
    np.testing.assert_array_equal(TokenCache.open(path).read_rows([0])[0], doc(5))


def test_resume_checks_dtype_and_metadata(tmp_path):
    path = str(tmp_path)
    writer = CacheWriter(path, metadata={"tokenizer": "a"})
    writer.write([doc(3)])
    writer.flush()
    with pytest.raises(ValueError, match=r"its ledger metadata .*'a'.* differs from .*'b'"):
        CacheWriter(path, if_exists="resume", metadata={"tokenizer": "b"})
    with pytest.raises(ValueError, match="input_ids/data has dtype int32, expected uint16"):
        CacheWriter(path, if_exists="resume", dtype="uint16", metadata={"tokenizer": "a"})


def test_exception_inside_writer_block_leaves_cache_unfinished(tmp_path):
    path = str(tmp_path)
    with pytest.raises(RuntimeError, match="boom"), CacheWriter(path, flush_tokens=100) as writer:
        writer.write(doc(i) for i in range(40, 50))
        raise RuntimeError("boom")
    cache = TokenCache.open(path, require_finished=False)
    # rows 40..49 have 40..49 tokens: commits after rows 3, 6 and 9; the buffered 10th is dropped
    assert not cache.is_finished and cache.num_rows == 9


@pytest.mark.parametrize(
    "row, message",
    [
        (np.zeros((2, 2), np.int32), r"row 0 must be a 1-D integer array \(got shape=\(2, 2\)"),
        (np.ones(3, np.float32), r"row 0 must be a 1-D integer array \(got shape=\(3,\), dtype=float32\)"),
        (np.array([1, 70_000]), r"row 0 has token values in \[1, 70000\] outside uint16"),
    ],
)
def test_bad_rows_are_rejected(tmp_path, row, message):
    with pytest.raises(ValueError, match=message):
        CacheWriter(str(tmp_path), dtype="uint16").write([row])


def test_sharded_writer_resumes_after_interruption(tmp_path):
    root = str(tmp_path)

    def failing_docs(start, stop, fail_at):
        for i in range(start, stop):
            if i == fail_at:
                raise RuntimeError("interrupted")
            yield doc(i)

    writer = ShardedCacheWriter(root)
    writer.write_shard("s0", (doc(i) for i in range(0, 30)))
    with pytest.raises(RuntimeError, match="interrupted"):
        writer.write_shard("s1", failing_docs(30, 60, fail_at=55), flush_tokens=100)
    partial = TokenCache.open(root, require_finished=False)
    assert (partial.num_rows, partial.num_shards, partial.is_finished) == (30, 1, False)  # s1 not listed yet

    resumed = ShardedCacheWriter(root, if_exists="resume")
    assert resumed.finished_shards == ("s0",)
    assert resumed.write_shard("s0", iter(())) == 30  # finished shards are skipped
    assert resumed.write_shard("s1", (doc(i) for i in range(30, 60))) == 30
    resumed.write_shard("s2", (doc(i) for i in range(60, 75)))
    resumed.finish()
    _assert_rows(root, 75)
    with open(os.path.join(root, "shard_ledger.json")) as f:
        assert json.load(f)["finished_shards"] == ["s0", "s1", "s2"]
