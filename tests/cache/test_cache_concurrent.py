"""A cache written, overwritten or resumed under an open reader; resumed builds over changed inputs.

A reader serves only the cache it loaded: rows a writer commits later are picked up by
``refresh``, a cache replaced under it (``if_exists="overwrite"``, a rewritten finished ledger, a
removed ledger) is a ``CacheChangedError`` on the next read from storage, never tokens of the new
cache.
"""

import json
import os

import numpy as np
import pytest

from meshbatch.cache import (
    BlockCache,
    CacheChangedError,
    CacheWriter,
    ShardedCacheWriter,
    TokenCache,
    build_cache,
    run_reads,
)
from meshbatch.cache.format.ledger import remove_ledger

OLD = [np.arange(n, dtype=np.int32) + 1000 * n for n in (5, 3, 7, 2)]
NEW = [np.arange(n, dtype=np.int32) + 7 for n in (9, 9, 9, 9, 9)]


def _write(path: str, docs, **kwargs) -> str:
    with CacheWriter(path, **kwargs) as writer:
        writer.write(docs)
    return path


def _cache_id(path: str) -> str:
    with open(os.path.join(path, "shard_ledger.json")) as f:
        return json.load(f)["cache_id"]


def test_overwrite_under_an_open_reader_is_detected_on_the_next_read(tmp_path):
    path = _write(str(tmp_path), OLD)
    reader = TokenCache.open(path)
    np.testing.assert_array_equal(reader.read_rows([2])[0], OLD[2])
    old_id = _cache_id(path)

    writer = CacheWriter(path, if_exists="overwrite")  # the new, empty ledger is committed at once
    new_id = _cache_id(path)
    assert new_id != old_id
    with pytest.raises(
        CacheChangedError, match=f"cache {path} changed under an open reader: it was replaced"
    ):
        reader.read_rows([2])
    writer.write(NEW)
    writer.finish()
    with pytest.raises(CacheChangedError, match=rf"it was replaced \(cache_id {old_id} -> {new_id}\)"):
        reader.read_spans([0], [3])  # tokens 0..2 exist in both caches: still refused
    with pytest.raises(CacheChangedError, match="it was replaced"):
        reader.refresh()
    np.testing.assert_array_equal(TokenCache.open(path).read_rows([4])[0], NEW[4])  # a new reader is fine


def test_a_removed_ledger_mid_overwrite_is_detected(tmp_path):
    path = _write(str(tmp_path), OLD)
    reader = TokenCache.open(path)
    remove_ledger(path)  # what an overwrite does first, before touching any array
    with pytest.raises(CacheChangedError, match=r"its ledger .*shard_ledger.json is gone"):
        reader.read_rows([0])


def test_blocks_cached_before_a_replacement_serve_the_loaded_rows_until_a_read_goes_to_storage(tmp_path):
    """A read served whole from the block cache reads nothing now: it returns rows of the ledger
    the reader loaded (read and checked when their blocks were), never the new cache's tokens;
    the first read that goes to storage is the ``CacheChangedError``."""
    path = _write(str(tmp_path), OLD)
    reader = TokenCache.open(path, block_cache=BlockCache(1 << 20, block_tokens=4))
    reader.read_rows([0, 1])  # tokens [0, 8): blocks 0 and 1
    _write(path, NEW, if_exists="overwrite")
    np.testing.assert_array_equal(reader.read_rows([0])[0], OLD[0])  # blocks 0, 1: no read, no check
    with pytest.raises(CacheChangedError, match="it was replaced"):
        reader.read_rows([2])  # tokens [8, 15): blocks 2 and 3 are read, then the ledger checked


def _without_cache_id(path: str) -> None:
    """The cache's ledger as Levanter writes it: no ``cache_id``."""
    ledger_path = os.path.join(path, "shard_ledger.json")
    with open(ledger_path) as f:
        ledger = json.load(f)
    del ledger["cache_id"]
    with open(ledger_path, "w") as f:
        json.dump(ledger, f)


@pytest.mark.parametrize("cache_id", [True, False], ids=["cache_id", "levanter"])
@pytest.mark.parametrize("eager", [True, False])
def test_a_reader_opened_after_a_replacement_never_gets_the_old_readers_blocks(tmp_path, eager, cache_id):
    """Readers of one path share a block cache. Readers of the same cache share its blocks (with a
    ``cache_id``; Levanter's caches have none, and each opening keeps its own); one opened after
    the cache was replaced reads the new cache's tokens, though an older reader's blocks of the
    same array, chunk and length are still in the LRU."""
    path = _write(str(tmp_path), OLD)
    if not cache_id:
        _without_cache_id(path)
    blocks = BlockCache(1 << 20, block_tokens=4)
    old = TokenCache.open(path, block_cache=blocks, eager=eager)
    np.testing.assert_array_equal(old.read_rows([0])[0], OLD[0])
    again = TokenCache.open(path, block_cache=blocks, eager=eager)  # the same cache
    np.testing.assert_array_equal(again.read_rows([0])[0], OLD[0])
    assert blocks.stats()["hits"] == (2 if cache_id else 0)  # row 0: tokens [0, 5), blocks 0 and 1
    _write(path, [doc + 1 for doc in OLD], if_exists="overwrite")  # the same lengths, other tokens
    if not cache_id:
        _without_cache_id(path)
    hits = blocks.stats()["hits"]
    new = TokenCache.open(path, block_cache=blocks, eager=eager)
    np.testing.assert_array_equal(new.read_rows([0])[0], OLD[0] + 1)
    assert blocks.stats()["hits"] == hits


def test_rewritten_finished_ledger_without_cache_id_is_detected(tmp_path):
    """Levanter writes no cache_id: a finished ledger that changes at all is a different cache."""
    path = _write(str(tmp_path), OLD)
    _without_cache_id(path)
    ledger_path = os.path.join(path, "shard_ledger.json")
    with open(ledger_path) as f:
        ledger = json.load(f)
    reader = TokenCache.open(path)
    ledger["is_finished"] = False
    with open(ledger_path, "w") as f:
        json.dump(ledger, f)
    with pytest.raises(CacheChangedError, match="its finished ledger was rewritten"):
        reader.read_rows([0])


def test_a_growing_or_resumed_cache_is_served_and_refreshed(tmp_path):
    path = str(tmp_path)
    writer = CacheWriter(path, flush_tokens=1)
    writer.write(OLD[:2])
    reader = TokenCache.open(path, require_finished=False)
    assert reader.num_rows == 2
    writer.write(OLD[2:3])  # committed while the reader is open: the cache grew, it was not replaced
    np.testing.assert_array_equal(reader.read_rows([1])[0], OLD[1])
    del writer  # killed; then resumed by another writer, which keeps the cache_id
    resumed = CacheWriter(path, if_exists="resume", flush_tokens=1)
    resumed.write(OLD[3:])
    np.testing.assert_array_equal(reader.read_rows([0])[0], OLD[0])
    assert reader.refresh() == 4
    resumed.finish()
    assert reader.refresh() == 4 and reader.is_finished
    np.testing.assert_array_equal(reader.read_rows([3])[0], OLD[3])


def test_run_reads_over_two_caches_names_the_replaced_one(tmp_path):
    a, b = _write(str(tmp_path / "a"), OLD), _write(str(tmp_path / "b"), OLD)
    readers = [TokenCache.open(a), TokenCache.open(b)]
    out = np.zeros(10, np.int32)
    plan = [readers[0].prepare_read([0], [5], out, 0), readers[1].prepare_read([0], [5], out, 5)]
    run_reads(plan)
    np.testing.assert_array_equal(out, np.concatenate([OLD[0], OLD[0]]))
    _write(b, NEW, if_exists="overwrite")
    plan = [readers[0].prepare_read([0], [5], out, 0), readers[1].prepare_read([0], [5], out, 5)]
    with pytest.raises(CacheChangedError, match=f"cache {b} changed under an open reader"):
        run_reads(plan)


def test_sharded_cache_overwritten_under_a_reader(tmp_path):
    root = str(tmp_path)
    writer = ShardedCacheWriter(root)
    writer.write_shard("p0", iter(OLD[:2]))
    writer.write_shard("p1", iter(OLD[2:]))
    writer.finish()
    reader = TokenCache.open(root)
    ShardedCacheWriter(root, if_exists="overwrite")
    with pytest.raises(CacheChangedError, match=f"cache {root} changed under an open reader"):
        reader.read_rows([3])


def test_resumed_build_refuses_an_input_changed_at_the_same_size(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("first line\nsecond line\n")
    out = str(tmp_path / "cache")
    build_cache(out, [str(text)], text_docs="line", progress=False)
    text.write_text("first line\nsecond LINE\n")  # same size, other bytes
    with pytest.raises(ValueError, match=rf"cannot resume {out}: input {text} changed since the build began"):
        build_cache(out, [str(text)], text_docs="line", progress=False)
    build_cache(out, [str(text)], text_docs="line", if_exists="overwrite", progress=False)
    assert (
        TokenCache.open(out).read_rows([1])[0][:6].tobytes()
        == np.frombuffer(b"second", np.uint8).astype(np.int32).tobytes()
    )


def test_leftover_temp_files_are_removed_when_a_writer_opens(tmp_path):
    path = _write(str(tmp_path), OLD[:1], flush_tokens=1)
    dead_pid = 2**22 + 1  # above the default pid_max: no such process
    leftovers = [
        os.path.join(path, f"shard_ledger.json.tmp-{dead_pid}-{'0' * 32}"),
        os.path.join(path, "input_ids", f"meshbatch_checksums.json.tmp-{dead_pid}-{'a' * 32}"),
    ]
    alive = os.path.join(path, f"shard_ledger.json.tmp-{os.getppid()}-{'b' * 32}")  # a live writer's
    for name in [*leftovers, alive]:
        with open(name, "w") as f:
            f.write('{"total_num')
    assert TokenCache.open(path).num_rows == 1  # readers never write: they ignore temp files
    CacheWriter(path, if_exists="overwrite").finish()
    assert not any(os.path.exists(name) for name in leftovers)
    assert os.path.exists(alive)


def test_ledger_stamp_off_a_local_disk_is_a_conditional_read():
    """On object stores (here TensorStore's memory kvstore) the stamp is the storage generation."""
    import tensorstore as ts

    from meshbatch.cache import shared_context
    from meshbatch.cache.format.ledger import Ledger, LedgerFile

    kvstore = ts.KvStore.open("memory://stamp-test/", context=shared_context()).result()
    kvstore.write("shard_ledger.json", json.dumps(Ledger(3, {"": 3}, cache_id="a").to_dict())).result()
    file = LedgerFile("memory://stamp-test")
    ledger, stamp = file.read()
    assert isinstance(stamp, bytes) and ledger.total_num_rows == 3
    assert file.changed(stamp)() == (False, None, stamp)
    kvstore.write("shard_ledger.json", json.dumps(Ledger(5, {"": 5}, cache_id="a").to_dict())).result()
    changed, now, new_stamp = file.changed(stamp)()
    assert changed and now.total_num_rows == 5 and new_stamp != stamp
    kvstore.delete_range(ts.KvStore.KeyRange("shard_ledger.json", "shard_ledger.json\x00")).result()
    assert file.changed(new_stamp)() == (True, None, None)
