"""Verified reads through a shared ``BlockCache``: one read per block, however many threads want it.

The thread that reads a block verifies every chunk the block covers whole before it hands the
block over; a thread that waits for that block reads nothing more (it verifies, from the block it
gets, only what its own reader has not verified: a block read by a reader with verification off).
Each case writes a real cache of 3 read chunks plus a few tokens (the last chunk is verified at
open), reads it with blocks of 2 chunks (block 0 = chunks 0 and 1) and counts the reads the file
kvstore serves (TensorStore's own counter; the context has no cache pool, so every read reaches it).
The waiting thread really waits: its read runs on a thread first, the block's reader after it.
"""

import os
import re
import threading

import numpy as np
import pytest
import tensorstore as ts

from meshbatch.cache import BlockCache, CacheIntegrityError, CacheWriter, TokenCache, run_reads
from meshbatch.cache.format.stores import store_context_spec

C = 1 << 18  # tokens per read chunk (and per checksummed chunk)
FLAT = (np.arange(3 * C + 1000) % 50_000).astype(np.int32)


def _write(path) -> str:
    with CacheWriter(str(path)) as writer:
        writer.write([FLAT[s : s + 10_000] for s in range(0, FLAT.size, 10_000)])
    return str(path)


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> str:
    return _write(tmp_path_factory.mktemp("verified_blocks") / "c")


def _damaged(tmp_path, chunk: int) -> str:
    path = _write(tmp_path / "d")
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(path, "input_ids", "data")}}
    at = chunk * C + 1234
    ts.open(spec, open=True).result()[at].write(int(FLAT[at]) + 1).result()  # still decodes
    return path


def _open(path, lru, **kwargs) -> TokenCache:
    context = ts.Context(store_context_spec(cache_bytes=0))  # every read reaches the kvstore
    return TokenCache.open(path, block_cache=lru, context=context, **kwargs)


def _file_reads() -> int:
    name = "/tensorstore/kvstore/file/read"
    return sum(
        m["values"][0].get("value", 0)
        for m in ts.experimental_collect_matching_metrics(name)
        if m["name"] == name
    )


def _plan(cache, start: int, n: int = 10):
    out = np.full(n, -1, np.int32)
    return out, cache.prepare_read(np.array([start]), np.array([n]), out, 0)


def _run_waiter_then_owner(owner, waiter) -> dict[str, BaseException]:
    """Runs ``waiter`` on a thread (it waits in its finish for the owner's block), then ``owner``."""
    errors: dict[str, BaseException] = {}

    def run(name, read):
        try:
            run_reads([read])
        except BaseException as e:  # each thread's outcome is checked by the test
            errors[name] = e

    thread = threading.Thread(target=run, args=("waiter", waiter))
    thread.start()
    run("owner", owner)
    thread.join(timeout=60)
    assert not thread.is_alive()
    return errors


def _block_alone(path) -> int:
    """File reads for reading block 0 once, no other thread involved (the baseline)."""
    cache = _open(path, BlockCache(1 << 26, block_tokens=2 * C))
    before = _file_reads()
    np.testing.assert_array_equal(cache.read_spans([100], [10])[0], FLAT[100:110])
    return _file_reads() - before


def test_a_thread_waiting_for_a_block_issues_no_read_of_its_own(intact):
    alone = _block_alone(intact)
    assert alone >= 1  # TensorStore counts the file kvstore's reads (else the count below proves nothing)
    lru = BlockCache(1 << 26, block_tokens=2 * C)
    cache = _open(intact, lru)
    out_a, owner = _plan(cache, 100)  # tokens in chunk 0: this read owns block 0
    out_b, waiter = _plan(cache, C + 100)  # tokens in chunk 1, in block 0 too: waits for it
    assert lru.stats()["shared"] == 1 and len(owner.targets) == 1
    assert [(t.start, t.dest.shape[0]) for t in waiter.targets] == []  # chunk 1 is the owner's to verify
    before = _file_reads()
    assert _run_waiter_then_owner(owner, waiter) == {}
    assert _file_reads() - before == alone  # the block's read and nothing more
    np.testing.assert_array_equal(out_a, FLAT[100:110])
    np.testing.assert_array_equal(out_b, FLAT[C + 100 : C + 110])
    verified = {k for k, _ in cache._contents.segments[0].verifier.verified()}
    assert verified == {0, 1, 3}  # block 0's two chunks, by its reader; chunk 3 (the last) at open
    assert cache.counters.reads_issued == 1


def test_a_chunk_a_block_covers_only_in_part_is_still_read_whole_by_each_thread(intact):
    lru = BlockCache(1 << 26, block_tokens=C // 2)  # block 0 = the first half of chunk 0
    cache = _open(intact, lru)
    out_a, owner = _plan(cache, 100)
    out_b, waiter = _plan(cache, 200)
    assert lru.stats()["shared"] == 1
    assert [(t.start, t.dest.shape[0]) for t in owner.targets] == [(0, C // 2), (0, C)]
    assert [(t.start, t.dest.shape[0]) for t in waiter.targets] == [(0, C)]  # no block covers chunk 0
    assert _run_waiter_then_owner(owner, waiter) == {}
    np.testing.assert_array_equal(out_a, FLAT[100:110])
    np.testing.assert_array_equal(out_b, FLAT[200:210])


@pytest.mark.parametrize("chunk", [0, 1])
def test_a_damaged_chunk_in_a_shared_block_fails_its_reader_and_the_waiting_thread(tmp_path, chunk):
    """Chunk 0 holds the owner's tokens, chunk 1 the waiting thread's: either way both fail, by
    name, and neither gets a token; the block is neither cached nor left claimed."""
    path = _damaged(tmp_path, chunk)
    lru = BlockCache(1 << 26, block_tokens=2 * C)
    cache = _open(path, lru)
    out_a, owner = _plan(cache, 100)
    out_b, waiter = _plan(cache, C + 100)
    errors = _run_waiter_then_owner(owner, waiter)
    assert set(errors) == {"owner", "waiter"}
    message = rf"chunk {chunk} \(elements \[{chunk * C}, {(chunk + 1) * C}\)\) fails its checksum"
    for error in errors.values():
        assert isinstance(error, CacheIntegrityError) and re.search(message, str(error)), error
    assert "read by another thread failed" in str(errors["waiter"])
    assert (out_a == -1).all() and (out_b == -1).all()
    assert lru.stats()["bytes"] == 0 and not lru._pending
    with pytest.raises(CacheIntegrityError, match=message):  # the next read reads it again, fails again
        cache.read_spans([chunk * C + 100], [10])


@pytest.mark.parametrize("damaged", [False, True])
def test_a_block_read_without_verification_is_verified_by_the_thread_that_waits_for_it(tmp_path, damaged):
    """Two readers share one block cache; the block's reader has verification off. The waiting
    reader verifies the chunks from the block it gets (no read of its own) before serving them."""
    path = _damaged(tmp_path, 1) if damaged else _write(tmp_path / "c")
    lru = BlockCache(1 << 26, block_tokens=2 * C)
    unverified, verified = _open(path, lru, verify=False), _open(path, lru)
    out_a, owner = _plan(unverified, 100)
    out_b, waiter = _plan(verified, C + 100)
    assert lru.stats()["shared"] == 1 and waiter.targets == []
    errors = _run_waiter_then_owner(owner, waiter)
    assert "owner" not in errors  # it asked for no verification
    np.testing.assert_array_equal(out_a, FLAT[100:110])
    chunks = {k for k, _ in verified._contents.segments[0].verifier.verified()}
    if damaged:
        assert isinstance(errors["waiter"], CacheIntegrityError)
        assert r"chunk 1 (elements [262144, 524288)) fails its checksum" in str(errors["waiter"])
        assert (out_b == -1).all() and chunks == {0, 3}
    else:
        assert errors == {}
        np.testing.assert_array_equal(out_b, FLAT[C + 100 : C + 110])
        assert chunks == {0, 1, 3}  # summed from the block it waited for
