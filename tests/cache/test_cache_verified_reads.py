"""Verified reads: damage that still decodes is a named error on *read*, not only in ``--deep``.

Each case writes a small real cache, damages it on disk (through TensorStore, so every chunk still
decodes, as bit rot or a careless edit would leave it) and reads it.
"""

import os
import shutil

import numpy as np
import pytest
import tensorstore as ts
from corpora import edit_ledger

from meshbatch.cache import (
    BlockCache,
    CacheIntegrityError,
    CacheWriter,
    ShardedCacheWriter,
    TokenCache,
    validate_cache,
)
from meshbatch.cache.integrity.verify import VERIFY_ENV

C = 1 << 18


def _docs(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 50_000, size=int(rng.integers(1, 400)), dtype=np.int32) for _ in range(n)]


DOCS = _docs(0, 200)
FLAT = np.concatenate(DOCS)
BIG = [np.resize(d, 20 * d.size) for d in DOCS]  # about 3 read chunks
BIG_FLAT = np.concatenate(BIG)


def _write(path, docs=DOCS) -> str:
    with CacheWriter(str(path)) as writer:
        writer.write(docs)
    return str(path)


def _array(path, name) -> ts.TensorStore:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(path, "input_ids", name)}}
    return ts.open(spec, open=True).result()


def _levanter(path, docs=DOCS) -> str:
    from levanter.store.cache import SerialCacheWriter

    with SerialCacheWriter(str(path), {"input_ids": np.zeros((0,), np.int32)}) as writer:
        writer.write_batch([{"input_ids": d} for d in docs])
    return str(path)


def test_a_changed_token_that_decodes_is_named_on_its_first_read(tmp_path):
    path = _write(tmp_path / "c", BIG)
    _array(path, "data")[1234].write(int(BIG_FLAT[1234]) + 1).result()
    cache = TokenCache.open(path)  # open verifies the offsets and the last chunk only
    with pytest.raises(
        CacheIntegrityError,
        match=rf"cache {path}: {path}/input_ids/data: chunk 0 \(elements \[0, {C}\)\) fails its "
        rf"checksum.*\(global tokens \[0, {C}\)\)",
    ):
        cache.read_spans([5000], [10])  # tokens far from the damage: the whole chunk is checked
    with pytest.raises(CacheIntegrityError, match="fails its checksum"):
        cache.read_rows([0])  # not remembered as verified
    with pytest.raises(CacheIntegrityError, match=r"chunk 0 \(elements \[0, 262144\)\) fails its checksum"):
        cache.read_spans([0], [C + 10])  # a read covering the chunk: summed from what it read
    assert validate_cache(path).ok  # metadata and the last chunk only
    assert "chunk 0 (elements [0, 262144)) fails its checksum" in validate_cache(path, deep=True).error


def test_block_cached_reads_are_verified_before_their_blocks_are_shared(tmp_path):
    path = _write(tmp_path / "c", BIG)
    lru = BlockCache(max_bytes=1 << 24, block_tokens=1 << 16)
    cache = TokenCache.open(path, block_cache=lru)
    got = cache.read_spans([5000, 2 * C + 7], [10, 300])  # chunks 0 and 2: not verified at open
    np.testing.assert_array_equal(got.tokens, np.r_[BIG_FLAT[5000:5010], BIG_FLAT[2 * C + 7 : 2 * C + 307]])
    assert lru.stats()["bytes"] > 0 and not lru._pending  # its blocks were handed over, none left claimed
    damaged = _write(tmp_path / "d", BIG)
    _array(damaged, "data")[1234].write(int(BIG_FLAT[1234]) + 1).result()
    lru = BlockCache(max_bytes=1 << 24, block_tokens=1 << 16)
    cache = TokenCache.open(damaged, block_cache=lru)
    for _ in range(2):  # the damaged block was never cached nor left claimed: the same error again
        with pytest.raises(CacheIntegrityError, match=r"chunk 0 \(elements \[0, 262144\)\) fails"):
            cache.read_spans([5000], [10])
    assert lru.stats()["bytes"] == 0 and not lru._pending


def test_a_verified_chunk_is_not_read_again_and_verification_can_be_turned_off(tmp_path, monkeypatch):
    path = _write(tmp_path / "c")
    cache = TokenCache.open(path)
    verifier = cache._contents.segments[0].verifier
    assert verifier.verified() == {(0, FLAT.size)}  # the last chunk, at open
    np.testing.assert_array_equal(cache.read_spans([7], [30])[0], FLAT[7:37])
    assert cache.counters.reads_issued == 1  # the verification read is not a data read

    _array(path, "data")[10].write(int(FLAT[10]) + 1).result()
    for off in (TokenCache.open(path, verify=False), _open_with_env(monkeypatch, path)):
        assert off._contents.segments[0].verifier is None
        assert off.read_spans([10], [1])[0][0] == FLAT[10] + 1  # served as it now is, unverified
    with pytest.raises(TypeError, match="verify must be a bool"):
        TokenCache.open(path, verify="no")


def _open_with_env(monkeypatch, path) -> TokenCache:
    monkeypatch.setenv(VERIFY_ENV, "0")
    try:
        return TokenCache.open(path)
    finally:
        monkeypatch.delenv(VERIFY_ENV)


def test_a_moved_offset_is_named_at_open(tmp_path):
    path = _write(tmp_path / "c")
    offsets = _array(path, "offsets")
    offsets[50].write(int(offsets[50].read().result()) + 2).result()  # still monotone
    with pytest.raises(
        CacheIntegrityError, match=r"input_ids/offsets: chunk 0 \(elements \[0, 201\)\) fails"
    ):
        TokenCache.open(path)


def test_a_sharded_cache_names_the_shard_and_the_global_tokens(tmp_path):
    root = str(tmp_path / "sharded")
    writer = ShardedCacheWriter(root)
    writer.write_shard("p0", iter(DOCS))
    writer.write_shard("p1", iter(BIG))
    writer.finish()
    first = FLAT.size
    _array(os.path.join(root, "p1"), "data")[3].write(7).result()
    cache = TokenCache.open(root)
    with pytest.raises(
        CacheIntegrityError,
        match=rf"{root}/p1/input_ids/data: chunk 0 .*\(global tokens \[{first}, {first + C}\)\)",
    ):
        cache.read_spans([first - 5], [10])  # a run across the shard boundary
    np.testing.assert_array_equal(cache.read_spans([0], [first])[0], FLAT)  # p0 is intact


def test_a_cache_read_while_it_is_written_verifies_only_committed_chunks(tmp_path):
    path = str(tmp_path / "open")
    docs = _docs(1, 3000)  # about 3 chunks of data
    writer = CacheWriter(path)
    writer.write(docs[:1500])
    writer.flush()
    reader = TokenCache.open(path, require_finished=False)
    writer.write(docs[1500:])
    writer.flush()
    flat = np.concatenate(docs)
    got = reader.read_spans([0], [reader.num_tokens])[0]
    np.testing.assert_array_equal(got, flat[: reader.num_tokens])
    writer.finish()
    reader.refresh()
    np.testing.assert_array_equal(reader.read_spans([0], [flat.size])[0], flat)
    verified = reader._contents.segments[0].verifier.verified()
    assert {k for k, _ in verified} == set(range(-(-flat.size // C)))


# -- caches without checksums (as Levanter writes them): what structure can tell -------------------


def test_levanter_cache_last_offset_moved_back_is_named_at_open(tmp_path):
    path = _levanter(tmp_path / "lev")
    offsets = _array(path, "offsets")
    end = int(offsets[len(DOCS)].read().result())
    cut = end - max(1, DOCS[-1].size // 2)
    offsets[len(DOCS)].write(cut).result()  # still monotone: the last row loses its second half
    edit_ledger(path, field_counts={"input_ids": cut})  # and the ledger agrees
    message = rf"the last row ends at token {cut}, but data\[{cut}\] = \d+ past it is not the fill"
    with pytest.raises(CacheIntegrityError, match=message):
        TokenCache.open(path)
    assert "is not the fill value 0" in validate_cache(path).error


def test_levanter_cache_data_chunk_from_a_larger_cache_is_named_at_open(tmp_path):
    path = _levanter(tmp_path / "lev", DOCS[:100])
    larger = _levanter(tmp_path / "larger", DOCS)
    os.replace(
        os.path.join(larger, "input_ids", "data", "c", "0"), os.path.join(path, "input_ids", "data", "c", "0")
    )
    with pytest.raises(CacheIntegrityError, match=r"data\[\d+\] = \d+ past it is not the fill value 0"):
        TokenCache.open(path)


def test_levanter_cache_offsets_past_the_last_row_are_named_at_open(tmp_path):
    path = _levanter(tmp_path / "lev")
    edit_ledger(
        path, total_num_rows=len(DOCS) - 1, field_counts={"input_ids": int(FLAT.size - DOCS[-1].size)}
    )
    _array(path, "offsets")[0].write(len(DOCS) - 1).result()  # a row dropped from the count only
    end = FLAT.size - DOCS[-1].size
    with pytest.raises(CacheIntegrityError, match=rf"data\[{end}\] = {DOCS[-1][0]} past it is not the fill"):
        TokenCache.open(path)


@pytest.mark.parametrize("damaged", [False, True])
def test_a_narrow_dtype_read_widened_into_int32_is_summed_in_its_own_dtype(tmp_path, damaged):
    from meshbatch.cache import run_reads

    docs = [(d % 60_000).astype(np.uint16) for d in BIG]
    flat = np.concatenate(docs)
    path = str(tmp_path / "u16")
    with CacheWriter(path, dtype="uint16") as writer:
        writer.write(docs)
    if damaged:
        _array(path, "data")[77].write(int(flat[77]) ^ 1).result()
    cache = TokenCache.open(path)
    out = np.zeros(flat.size, np.int32)  # decoded straight into int32: the chunk is cast back to sum it
    read = cache.prepare_read(np.array([0]), np.array([flat.size]), out, 0)
    if damaged:
        with pytest.raises(CacheIntegrityError, match=r"chunk 0 .* fails its checksum"):
            run_reads([read])
    else:
        run_reads([read])
        np.testing.assert_array_equal(out, flat)
        assert {k for k, _ in cache._contents.segments[0].verifier.verified()} == set(
            range(-(-flat.size // C))
        )


def test_levanter_reads_verified_caches_and_why_they_carry_no_crc32c_codec(tmp_path):
    """Levanter's own reader loads a meshbatch cache (sidecar and all); the same cache with zarr's
    ``crc32c`` codec added is refused by Levanter, which is why caches keep Levanter's codecs."""
    from levanter.store.cache import TreeCache

    exemplar = {"input_ids": np.zeros((0,), np.int32)}
    path = _write(tmp_path / "ours")
    TokenCache.open(path).read_rows([0])  # verified
    rows = TreeCache.load(path, exemplar).get_batch_sync([0, 199])
    np.testing.assert_array_equal(rows[1]["input_ids"], DOCS[199])

    with_codec = str(tmp_path / "crc32c")
    os.makedirs(with_codec)
    for name in ("offsets", "data"):
        source = _array(path, name)
        metadata = source.spec().to_json()["metadata"]
        metadata["codecs"][0]["configuration"]["codecs"].append({"name": "crc32c"})
        spec = {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": os.path.join(with_codec, "input_ids", name)},
        }
        target = ts.open({**spec, "metadata": metadata}, create=True).result()
        n = len(DOCS) + 1 if name == "offsets" else FLAT.size
        target[:n].write(source[:n].read().result()).result()
    with open(os.path.join(path, "shard_ledger.json")) as f:
        ledger = f.read()
    with open(os.path.join(with_codec, "shard_ledger.json"), "w") as f:
        f.write(ledger)
    sidecar = os.path.join("input_ids", "meshbatch_checksums.json")  # its ledger requires it
    shutil.copyfile(os.path.join(path, sidecar), os.path.join(with_codec, sidecar))
    np.testing.assert_array_equal(TokenCache.open(with_codec).read_rows([199])[0], DOCS[199])
    with pytest.raises(ValueError, match=r"Mismatch in \"codecs\""):
        TreeCache.load(with_codec, exemplar).get_batch_sync([0])
