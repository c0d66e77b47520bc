"""Quick start: a reader on a cache under construction sees only committed rows and catches up."""

import threading

import numpy as np
import pytest

from meshbatch.cache import BlockCache, CacheWriter, ShardedCacheWriter, TokenCache


def doc(i: int) -> np.ndarray:
    return np.arange(i % 23 + 1, dtype=np.int32) + 1000 * i


def _check_prefix(reader: TokenCache) -> None:
    for i, row in enumerate(reader.read_rows(np.arange(reader.num_rows))):
        np.testing.assert_array_equal(row, doc(i), err_msg=f"row {i}")


def test_reader_sees_committed_rows_only_and_refreshes(tmp_path):
    path = str(tmp_path)
    writer = CacheWriter(path)
    reader = TokenCache.open(path, require_finished=False)
    assert (reader.num_rows, reader.num_tokens, reader.is_finished) == (0, 0, False)

    writer.write(doc(i) for i in range(10))  # buffered, not committed
    assert reader.refresh() == 0
    writer.flush()
    assert reader.num_rows == 0  # nothing changes until refresh
    assert reader.refresh() == 10
    _check_prefix(reader)

    writer.write(doc(i) for i in range(10, 25))
    writer.flush()
    with pytest.raises(IndexError, match=r"out of range .* of 10 rows"):
        reader.read_rows([12])  # committed on disk, but this reader has not refreshed yet
    assert reader.wait_for_rows(20, timeout=0) == 25
    _check_prefix(reader)

    writer.finish()
    assert reader.refresh() == 25 and reader.is_finished
    with pytest.raises(IndexError, match="finished with 25 rows < n=26"):
        reader.wait_for_rows(26)


def test_wait_for_rows_times_out(tmp_path):
    CacheWriter(str(tmp_path)).flush()
    reader = TokenCache.open(str(tmp_path), require_finished=False)
    with pytest.raises(TimeoutError, match=r"has 0 rows < n=1 after timeout=0\.05s"):
        reader.wait_for_rows(1, timeout=0.05)


def test_reader_catches_up_with_a_concurrent_writer(tmp_path):
    path, batch, batches = str(tmp_path), 7, 12
    writer = CacheWriter(path)
    reader = TokenCache.open(path, require_finished=False, block_cache=BlockCache(1 << 20, block_tokens=64))

    def write():
        for b in range(batches):
            writer.write(doc(i) for i in range(b * batch, (b + 1) * batch))
            writer.flush()
        writer.finish()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        seen = 0
        while seen < batch * batches:
            seen = reader.wait_for_rows(seen + 1, timeout=120)
            assert seen % batch == 0  # whole commits only
            _check_prefix(reader)  # the block cache never serves a stale, shorter tail block
    finally:
        thread.join()
    assert reader.refresh() == batch * batches and reader.is_finished


def test_sharded_reader_sees_finished_shards_as_they_land(tmp_path):
    root = str(tmp_path)
    writer = ShardedCacheWriter(root)
    reader = TokenCache.open(root, require_finished=False)
    assert (reader.layout, reader.num_rows, reader.num_shards) == ("sharded", 0, 0)

    writer.write_shard("a", (doc(i) for i in range(0, 9)))
    assert reader.refresh() == 9 and reader.num_shards == 1
    writer.write_shard("b", (doc(i) for i in range(9, 30)))
    writer.finish()
    assert reader.refresh() == 30 and reader.is_finished and reader.num_shards == 2
    _check_prefix(reader)
