"""The bounded block LRU, on its own and under TokenCache reads; the shared TensorStore context."""

import numpy as np
import pytest

from meshbatch.cache import BlockCache, CacheWriter, ShardedCacheWriter, TokenCache, shared_context


def test_lru_evicts_least_recently_used_beyond_max_bytes():
    cache = BlockCache(max_bytes=3 * 40, block_tokens=10)  # three int32 blocks of 10 tokens
    blocks = {k: np.full(10, i, np.int32) for i, k in enumerate("abcd")}
    for k in "abc":
        cache.put(k, blocks[k])
    assert cache.get("a") is blocks["a"]  # a becomes most recent; b is now least recent
    cache.put("d", blocks["d"])
    assert cache.get("b") is None
    assert all(cache.get(k) is blocks[k] for k in "acd")
    assert cache.stats() == {"hits": 4, "misses": 1, "evictions": 1, "shared": 0, "blocks": 3, "bytes": 120}

    cache.put("huge", np.zeros(31, np.int32))  # larger than the whole budget: not kept
    assert cache.get("huge") is None and cache.stats()["bytes"] == 120
    cache.clear()
    assert cache.stats()["blocks"] == 0 and cache.stats()["bytes"] == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_bytes": 0}, r"max_bytes must be >= 1 \(got max_bytes=0\)"),
        ({"max_bytes": 8, "block_tokens": 0}, r"block_tokens must be >= 1 \(got block_tokens=0\)"),
    ],
)
def test_lru_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BlockCache(**kwargs)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """The same 2000 tokens (token t = t) as a consolidated cache and as a 3-shard cache."""
    root = tmp_path_factory.mktemp("blocks")
    docs = [np.arange(s, s + 100, dtype=np.int32) for s in range(0, 2000, 100)]
    with CacheWriter(str(root / "one")) as writer:
        writer.write(docs)
    sharded = ShardedCacheWriter(str(root / "many"))
    for name, part in (("x", docs[:7]), ("y", docs[7:8]), ("z", docs[8:])):
        sharded.write_shard(name, iter(part))
    sharded.finish()
    return str(root / "one"), str(root / "many")


@pytest.mark.parametrize("layout", [0, 1])
def test_block_cached_reads_equal_direct_reads_and_save_reads(paths, layout):
    lru = BlockCache(max_bytes=1 << 20, block_tokens=64)
    cache = TokenCache.open(paths[layout], block_cache=lru)
    rng = np.random.default_rng(layout)
    for _ in range(20):
        starts = rng.integers(0, 1900, size=12)
        lengths = rng.integers(0, 100, size=12)
        got = cache.read_spans(starts, lengths)
        for i, (s, n) in enumerate(zip(starts, lengths, strict=True)):
            np.testing.assert_array_equal(got[i], np.arange(s, s + n, dtype=np.int32))

    first = cache.read_spans([130], [200])
    cache.counters.reset()
    again = cache.read_spans([130], [200])  # blocks 2..5 are cached now
    assert cache.counters.reads_issued == 0 and cache.counters.bytes_read == 0
    np.testing.assert_array_equal(first.tokens, again.tokens)
    stats = lru.stats()
    assert stats["hits"] > 0 and stats["bytes"] <= lru.max_bytes


def test_block_reads_merge_consecutive_missing_blocks(paths):
    lru = BlockCache(max_bytes=1 << 20, block_tokens=64)
    cache = TokenCache.open(paths[0], block_cache=lru)
    got = cache.read_spans([10, 300], [5, 10])  # blocks 0 and 4: two reads of whole blocks
    assert cache.counters.reads_issued == 2 and cache.counters.bytes_read == 2 * 64 * 4
    np.testing.assert_array_equal(got.tokens, [10, 11, 12, 13, 14, *range(300, 310)])
    cache.counters.reset()
    cache.read_spans([0], [64 * 6])  # blocks 0..5: 0 and 4 cached; 1-3 in one read, 5 in another
    assert cache.counters.reads_issued == 2 and cache.counters.bytes_read == 4 * 64 * 4
    assert lru.stats()["hits"] == 2


def test_small_lru_still_returns_correct_tokens(paths):
    lru = BlockCache(max_bytes=2 * 64 * 4, block_tokens=64)  # two blocks: evicts within one request
    cache = TokenCache.open(paths[1], block_cache=lru)
    got = cache.read_spans([0, 1000, 1500], [700, 20, 400])
    np.testing.assert_array_equal(got.tokens, np.r_[0:700, 1000:1020, 1500:1900])
    assert lru.stats()["evictions"] > 0 and lru.stats()["bytes"] <= lru.max_bytes


def test_opens_share_one_tensorstore_context(paths):
    a, b = TokenCache.open(paths[0]), TokenCache.open(paths[1])
    assert a.context is b.context is shared_context()


def test_a_block_being_read_is_shared_not_read_twice():
    lru = BlockCache(max_bytes=1 << 20, block_tokens=4)
    block, pending, owner = lru.claim("b")
    assert block is None and owner
    _, waiting, second = lru.claim("b")  # another thread misses while the read is in flight
    assert waiting is pending and not second and not waiting.done.is_set()
    lru.fulfil("b", np.arange(4, dtype=np.int32))
    assert waiting.done.is_set()
    np.testing.assert_array_equal(waiting.block, [0, 1, 2, 3])
    assert lru.stats()["misses"] == 1 and lru.stats()["shared"] == 1
    assert lru.claim("b")[0] is not None  # cached now: a hit
    assert lru.claim("c")[2]  # owner
    _, waiter, _ = lru.claim("c")
    lru.abandon("c", OSError("store gone"))
    assert waiter.done.is_set() and isinstance(waiter.error, OSError) and waiter.block is None
    assert lru.claim("c")[2]  # the next miss reads it again


def test_block_reads_of_chunks_verified_on_first_read(tmp_path):
    """A cache bigger than one checksummed chunk: the first block reads also verify the chunks
    (the reads' finish is wrapped), and the blocks still reach the request that read them."""
    docs = [np.arange(s, s + 10_000, dtype=np.int32) for s in range(0, 300_000, 10_000)]
    with CacheWriter(str(tmp_path / "c")) as writer:
        writer.write(docs)
    lru = BlockCache(max_bytes=1 << 24, block_tokens=64)
    cache = TokenCache.open(str(tmp_path / "c"), block_cache=lru)
    got = cache.read_spans([10, 270_000], [5, 10])
    np.testing.assert_array_equal(got.tokens, [*range(10, 15), *range(270_000, 270_010)])
    assert lru.stats()["misses"] == 2
