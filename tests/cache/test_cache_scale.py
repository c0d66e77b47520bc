"""Opening caches of many shards and many documents: concurrent shard reads, no offsets at open.

A cache is opened eagerly (every offset loaded, every shard opened and checked at open) or lazily
(from the cache's ledger: a shard's ledger and arrays are read and checked on the first read that
touches it, and offsets are read where asked for). Here: an eager open reads the shard ledgers in
one round of concurrent requests and a lazy one reads none but the first shard's (counted at a
real fake-gcs-server); a lazy open holds nothing per document; lazy reads
equal eager ones; and a damaged shard raises the error an eager open raises, before any of its
tokens are served.
"""

import json
import os
import re
import shutil
import tracemalloc
import uuid

import numpy as np
import pytest
import tensorstore as ts

from meshbatch.cache import (
    BlockCache,
    CacheChangedError,
    CacheIntegrityError,
    CacheWriter,
    ShardedCacheWriter,
    TokenCache,
)
from meshbatch.cache.format.stores import kvstore_spec, shared_context
from meshbatch.cache.read.reader import EAGER_MAX_ROWS


def _docs(n: int, seed: int = 0, high: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, 30_000, rng.integers(0, high)).astype(np.int32) for _ in range(n)]


def _sharded(root: str, docs: list[np.ndarray], shards: int, *, empty: tuple[int, ...] = ()) -> str:
    """``docs`` split over ``shards`` shards ``p0, p1, ...``; the shards in ``empty`` get no rows."""
    writer = ShardedCacheWriter(root)
    full = [i for i in range(shards) if i not in empty]
    bounds = np.linspace(0, len(docs), len(full) + 1).astype(int)
    for i in range(shards):
        if i in empty:
            writer.write_shard(f"p{i}", [])
        else:
            k = full.index(i)
            writer.write_shard(f"p{i}", docs[bounds[k] : bounds[k + 1]])
    writer.finish()
    return root


def _consolidated(path: str, docs: list[np.ndarray], **kwargs) -> str:
    with CacheWriter(path, **kwargs) as writer:
        writer.write(docs)
    return path


def _upload(local: str, url: str) -> None:
    """Copies every file of the local cache ``local`` to ``url`` (one round of concurrent PUTs)."""
    store = ts.KvStore.open(kvstore_spec(url), context=shared_context()).result()
    futures = []
    for parent, _, names in os.walk(local):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                futures.append(store.write(os.path.relpath(path, local), f.read()))
    for future in futures:
        future.result()


def _array(path, *parts) -> ts.TensorStore:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(path, *parts)}}
    return ts.open(spec, open=True).result()


def _edit_json(path: str, **changes) -> None:
    with open(path) as f:
        raw = json.load(f)
    raw.update(changes)
    with open(path, "w") as f:
        json.dump(raw, f)


# -- round trips: counted at a real object-store server -------------------------------------------


@pytest.mark.parametrize("shards", [10, 50])
def test_shard_ledgers_are_read_in_one_round_of_requests(object_stores, tmp_path, shards):
    local = _sharded(str(tmp_path / "c"), _docs(4 * shards), shards)
    url = f"gs://meshbatch/{uuid.uuid4().hex}/cache"
    _upload(local, url)
    proxy = object_stores["gcs_front"]
    with proxy.count_rounds("shard_ledger.json") as rounds:
        eager = TokenCache.open(url, eager=True)
    assert rounds.requests == shards + 1  # the cache's ledger, then every shard's
    assert rounds.rounds == 2, rounds.sizes  # not one round per shard: [1, shards]
    assert eager.num_rows == 4 * shards
    with proxy.count_rounds("shard_ledger.json") as rounds:
        lazy = TokenCache.open(url, eager=False)
    assert rounds.requests == 2, rounds.sizes  # the cache's ledger, and the first shard's (its dtype)
    with proxy.count_rounds("shard_ledger.json") as rounds:
        lazy.read_rows(list(range(4, 4 * shards, 4)))  # a row of every other shard
    # their ledgers together, then only the checks after the read (the cache's ledger and theirs):
    # a few rounds (a client may open its connections in waves), never one per shard
    assert rounds.requests <= 2 * shards and rounds.rounds <= 4, rounds.sizes
    with proxy.count_rounds("shard_ledger.json") as rounds:
        lazy.read_rows([5, 9])
    assert rounds.requests <= 3, rounds.sizes  # only the checks: each shard's ledger is read once


def test_a_lazy_open_opens_one_shard_and_a_read_only_the_shards_it_touches(object_stores, tmp_path):
    docs = _docs(200)
    local = _sharded(str(tmp_path / "c"), docs, 50)
    url = f"gs://meshbatch/{uuid.uuid4().hex}/cache"
    _upload(local, url)
    proxy = object_stores["gcs_front"]
    with proxy.count_rounds("zarr.json") as opened:
        cache = TokenCache.open(url, eager=False)
    assert opened.requests == 2  # offsets and data of the first shard: its dtype is the cache's
    with proxy.count_rounds("zarr.json") as opened:
        got = cache.read_rows([8, 13])  # rows 8-11 are shard p2, 12-15 p3
    assert opened.requests == 4 and opened.rounds == 1  # p2 and p3, opened together
    assert [g.tolist() for g in got] == [docs[8].tolist(), docs[13].tolist()]
    with proxy.count_rounds("zarr.json") as opened:
        cache.read_rows([9, 14])
    assert opened.requests == 0  # opened once


# -- memory: what a lazy open holds does not grow with documents -----------------------------------


def _held_after_open(path: str, **kwargs) -> tuple[TokenCache, int]:
    """The cache and the bytes Python and numpy allocated for it that it still holds after open."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = TokenCache.open(path, **kwargs)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return cache, held


@pytest.mark.parametrize("layout", ["consolidated", "sharded"])
def test_a_lazy_open_holds_no_per_document_offsets(tmp_path, layout):
    caches = {}
    for n in (2_000, 200_000):  # one or two tokens a document: a large count written quickly
        docs = _docs(n, seed=n, high=3)
        path = str(tmp_path / f"{layout}-{n}")
        if layout == "consolidated":
            _consolidated(path, docs)
        else:
            _sharded(path, docs, 8)
        caches[n] = (docs, path)
    held = {}
    for n, (docs, path) in caches.items():
        cache, held[n] = _held_after_open(path, eager=False)
        assert not cache.is_eager
        assert (cache.num_rows, cache.num_tokens) == (n, sum(d.size for d in docs))
    offsets_bytes = 8 * 200_000
    assert held[200_000] < held[2_000] + offsets_bytes // 20, held
    _, held_eager = _held_after_open(caches[200_000][1], eager=True)
    assert held_eager > offsets_bytes  # the measure sees offsets where they are loaded
    assert TokenCache.open(caches[200_000][1]).is_eager is False  # more than EAGER_MAX_ROWS: lazy
    assert 200_000 > EAGER_MAX_ROWS and TokenCache.open(caches[2_000][1]).is_eager


# -- what is read: equal to an eager open ----------------------------------------------------------


def _same_reads(eager: TokenCache, lazy: TokenCache, docs: list[np.ndarray]) -> None:
    assert (lazy.num_rows, lazy.num_tokens, lazy.dtype, lazy.num_shards, lazy.layout) == (
        eager.num_rows,
        eager.num_tokens,
        eager.dtype,
        eager.num_shards,
        eager.layout,
    )
    rng = np.random.default_rng(3)
    rows = rng.integers(0, len(docs), 300)
    for want, a, b in zip((docs[r] for r in rows), eager.read_rows(rows), lazy.read_rows(rows), strict=True):
        np.testing.assert_array_equal(a, want)
        np.testing.assert_array_equal(b, want)
    starts, lengths = lazy.row_spans(rows)
    e_starts, e_lengths = eager.row_spans(rows)
    np.testing.assert_array_equal(starts, e_starts)
    np.testing.assert_array_equal(lengths, e_lengths)
    spans = rng.integers(0, eager.num_tokens - 97, 200)
    for a, b in zip(eager.read_spans(spans, 97), lazy.read_spans(spans, 97), strict=True):
        np.testing.assert_array_equal(a, b)
    whole = lazy.read_spans([0], [lazy.num_tokens])[0]
    np.testing.assert_array_equal(whole, np.concatenate(docs))
    np.testing.assert_array_equal(lazy.doc_offsets(), eager.doc_offsets())
    np.testing.assert_array_equal(lazy.doc_lengths(), [d.size for d in docs])


def test_lazy_reads_equal_eager_reads_sharded(tmp_path):
    docs = _docs(900, seed=1)
    root = _sharded(str(tmp_path / "s"), docs, 12, empty=(0, 5, 11))
    _same_reads(TokenCache.open(root, eager=True), TokenCache.open(root, eager=False), docs)
    blocks = BlockCache(1 << 20, block_tokens=64)
    _same_reads(TokenCache.open(root), TokenCache.open(root, eager=False, block_cache=blocks), docs)


@pytest.mark.parametrize("verify", [True, False])
def test_lazy_reads_equal_eager_reads_consolidated(tmp_path, verify):
    docs = _docs(3000, seed=2)
    path = _consolidated(str(tmp_path / "c"), docs)
    _same_reads(TokenCache.open(path, eager=True), TokenCache.open(path, eager=False, verify=verify), docs)


def test_lazy_reads_at_an_object_store_equal_local_ones(object_stores, tmp_path):
    docs = _docs(400, seed=4)
    local = _sharded(str(tmp_path / "s"), docs, 20, empty=(3,))
    url = f"gs://meshbatch/{uuid.uuid4().hex}/cache"
    _upload(local, url)
    _same_reads(TokenCache.open(local, eager=True), TokenCache.open(url, eager=False), docs)


def test_row_spans_refuses_rows_out_of_range_by_name(tmp_path):
    path = _consolidated(str(tmp_path / "c"), _docs(10))
    cache = TokenCache.open(path, eager=False)
    with pytest.raises(IndexError, match=r"row 10 out of range for cache .* of 10 rows"):
        cache.row_spans([3, 10])
    with pytest.raises(TypeError, match="rows"):
        cache.row_spans([1.5])


def test_eager_must_be_a_bool(tmp_path):
    path = _consolidated(str(tmp_path / "c"), _docs(10))
    with pytest.raises(TypeError, match="eager"):
        TokenCache.open(path, eager="yes")


# -- damage: the eager open's error, at the lazy reader's first read of the shard -----------------


def _two_shards(tmp_path) -> tuple[str, list[np.ndarray]]:
    docs = _docs(60, seed=5)
    return _sharded(str(tmp_path / "s"), docs, 2), docs


def _delete_sidecar(root):
    os.remove(os.path.join(root, "p1", "input_ids", "meshbatch_checksums.json"))
    return CacheIntegrityError, "meshbatch_checksums.json is missing, but the ledger"


def _other_dtype(root):
    """p1's field replaced by the same rows stored as uint16 (the ledgers' counts still agree)."""
    other = os.path.join(os.path.dirname(root), "other")
    docs = [d.astype(np.uint16) for d in _docs(60, seed=5)[30:]]
    _consolidated(other, docs, dtype="uint16")
    shutil.rmtree(os.path.join(root, "p1", "input_ids"))
    shutil.copytree(os.path.join(other, "input_ids"), os.path.join(root, "p1", "input_ids"))
    return ValueError, f"{root}/p1/input_ids/data has dtype uint16, expected int32"


def _moved_last_offset(root):
    offsets = _array(os.path.join(root, "p1"), "input_ids", "offsets")
    end = int(offsets[30].read().result())
    offsets[30].write(end - 1).result()  # still monotone: the shard's last row loses a token
    return CacheIntegrityError, rf"{root}/p1/input_ids/offsets reach token {end - 1}, but the ledger"


def _deleted_data_chunk(root):
    os.unlink(os.path.join(root, "p1", "input_ids", "data", "c", "0"))
    return CacheIntegrityError, "the data chunk holding token .* cannot be read: NOT_FOUND"


def _flipped_token(root):
    data = _array(os.path.join(root, "p1"), "input_ids", "data")
    data[0].write(int(data[0].read().result()) ^ 1).result()
    return CacheIntegrityError, "p1/input_ids/data: chunk 0 .* fails its checksum"


DAMAGE = {
    "deleted sidecar": _delete_sidecar,
    "another dtype": _other_dtype,
    "moved last offset": _moved_last_offset,
    "deleted data chunk": _deleted_data_chunk,
    "flipped token": _flipped_token,
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_shard_raises_before_any_of_its_tokens_are_served(tmp_path, case):
    root, docs = _two_shards(tmp_path)
    lazy = TokenCache.open(root, eager=False)  # opened before the damage: only p0 is open
    error, message = DAMAGE[case](root)
    with pytest.raises(error, match=message):
        TokenCache.open(root, eager=True)  # an eager open checks every shard, p1's last chunk too
    for reader in (lazy, TokenCache.open(root, eager=False)):
        np.testing.assert_array_equal(reader.read_rows([3])[0], docs[3])  # p0 is intact
        with pytest.raises(error, match=message):
            reader.read_rows([45])
        with pytest.raises(error, match=message):
            reader.read_spans([0], [reader.num_tokens])


def test_a_missing_shard_ledger_is_named_at_open_or_at_the_first_read_of_the_shard(tmp_path):
    root, _ = _two_shards(tmp_path)
    os.remove(os.path.join(root, "p1", "shard_ledger.json"))
    missing = re.escape(f"no ledger at {root}/p1/shard_ledger.json")
    with pytest.raises(FileNotFoundError, match=missing):
        TokenCache.open(root, eager=True)
    lazy = TokenCache.open(root, eager=False)  # reads only the cache's ledger and p0
    with pytest.raises(FileNotFoundError, match=missing):
        lazy.read_rows([45])


def test_a_shard_replaced_after_its_first_read_is_a_changed_cache(tmp_path):
    root, docs = _two_shards(tmp_path)
    lazy = TokenCache.open(root, eager=False)
    np.testing.assert_array_equal(lazy.read_rows([45])[0], docs[45])  # p1's ledger is read here
    shutil.rmtree(os.path.join(root, "p1"))
    _consolidated(os.path.join(root, "p1"), docs[30:])  # the same rows, another cache_id
    with pytest.raises(CacheChangedError, match="shard 'p1' was replaced"):
        lazy.read_rows([45])
    np.testing.assert_array_equal(lazy.read_rows([3])[0], docs[3])  # p0 is still the one opened


def test_a_shard_replaced_by_other_rows_before_its_first_read_is_refused(tmp_path):
    root, docs = _two_shards(tmp_path)
    lazy = TokenCache.open(root, eager=False)
    shutil.rmtree(os.path.join(root, "p1"))
    _consolidated(os.path.join(root, "p1"), docs[31:])  # one row fewer than the cache's ledger says
    with pytest.raises(CacheIntegrityError, match="p1"):
        lazy.read_rows([45])


def test_damaged_offsets_of_a_lazily_opened_cache_are_named_where_read(tmp_path):
    docs = _docs(500, seed=6)
    path = _consolidated(str(tmp_path / "c"), docs)
    offsets = _array(path, "input_ids", "offsets")
    value = int(offsets[50].read().result())
    offsets[50].write(value + 1).result()  # still monotone: the sidecar's sum finds it
    cache = TokenCache.open(path, eager=False)
    with pytest.raises(CacheIntegrityError, match=r"input_ids/offsets: chunk 0 .* fails its checksum"):
        cache.row_spans([49])
    with pytest.raises(CacheIntegrityError, match=r"input_ids/offsets: chunk 0 .* fails its checksum"):
        cache.doc_offsets()
    unverified = TokenCache.open(path, eager=False, verify=False)  # nothing to sum against
    offsets[50].write(int(offsets[52].read().result()) + 1).result()  # row 50 now ends past row 51
    with pytest.raises(CacheIntegrityError, match=r"input_ids/offsets not monotone: row 50 spans"):
        unverified.read_rows([50])
    with pytest.raises(CacheIntegrityError, match=r"input_ids/offsets not monotone: row 50 spans"):
        unverified.doc_lengths()
