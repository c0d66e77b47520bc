"""Host-boundary argument checks of the cache entry points: wrong types and values are named errors.

Wrong type -> TypeError, wrong value -> ValueError, an index or span outside the cache -> IndexError;
every message names the parameter. Nothing is truncated (``1.5`` is not row 1) or wrapped (a span
whose end overflows int64 is refused, not read at a negative offset).
"""

import numpy as np
import pytest

from meshbatch.cache import BlockCache, CacheWriter, ShardedCacheWriter, TokenCache, build_cache

DOCS = [np.arange(n, dtype=np.int32) + 10 * n for n in (5, 3, 0, 7)]
BIG = 2**62


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> TokenCache:
    path = str(tmp_path_factory.mktemp("args") / "cache")
    with CacheWriter(path) as writer:
        writer.write(DOCS)
    return TokenCache.open(path)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda c: c.read_rows([1.5]), TypeError, r"rows must be integers \(got dtype float64\)"),
        (lambda c: c.read_rows("1"), TypeError, "rows must be integers"),
        (lambda c: c.read_rows([True]), TypeError, r"rows must be integers \(got dtype bool\)"),
        (lambda c: c.read_rows([-1]), IndexError, "row -1 out of range"),
        (lambda c: c.read_rows([4]), IndexError, "row 4 out of range for cache .* of 4 rows"),
        (lambda c: c.read_rows([2**63]), ValueError, "rows must fit int64"),
        (lambda c: c.read_spans([0], [-2]), ValueError, r"lengths must be >= 0 \(got lengths\[0\]=-2\)"),
        (lambda c: c.read_spans([0.0], [2]), TypeError, "starts must be integers"),
        (lambda c: c.read_spans(["0"], [2]), TypeError, "starts must be integers"),
        (lambda c: c.read_spans([BIG], [BIG]), IndexError, f"span 0 has start={BIG} > num_tokens=15"),
        (lambda c: c.read_spans([1], [2**63 - 1]), IndexError, "span 0 has length=9223372036854775807 >"),
        (lambda c: c.read_runs([3], [13]), IndexError, "span 0 .*ends at token 16 > num_tokens=15"),
        (lambda c: c.read_runs([0], 2**64), ValueError, "lengths must fit int64"),
        (lambda c: c.prepare_read([0], [2], [0, 0], 0), TypeError, "out must be a 1-D integer numpy array"),
        (lambda c: c.prepare_read([0], [2], np.zeros(2, np.float32), 0), TypeError, "out must be .*integer"),
        (lambda c: c.prepare_read([0], [2], np.zeros(2, np.int32), -1), ValueError, r"at must be >= 0"),
        (lambda c: c.prepare_read([0], [2], np.zeros(2, np.int32), 1.0), TypeError, "at must be an int"),
        (
            lambda c: c.prepare_read([0], [3], np.zeros(2, np.int32), 0),
            ValueError,
            "3 tokens at 0 do not fit",
        ),
        (lambda c: c.wait_for_rows(2.5), TypeError, "n must be an int"),
        (lambda c: c.wait_for_rows(1, timeout="5"), TypeError, "timeout must be a number"),
    ],
)
def test_read_arguments(cache, call, error, message):
    with pytest.raises(error, match=message):
        call(cache)


def test_reads_after_refused_arguments_are_unharmed(cache):
    np.testing.assert_array_equal(cache.read_rows(np.array([3], np.uint8))[0], DOCS[3])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"path": None}, TypeError, "path must be a non-empty str or os.PathLike"),
        ({"path": 7}, TypeError, "path must be"),
        ({"field": 3}, TypeError, "field must be a str"),
        ({"require_finished": "no"}, TypeError, "require_finished must be a bool"),
        ({"dtype": "float32"}, ValueError, "dtype must be an integer dtype .*got dtype=float32"),
        ({"dtype": "banana"}, TypeError, "dtype='banana' is not a numpy dtype"),
        ({"block_cache": 1 << 20}, TypeError, "block_cache must be a BlockCache or None"),
        ({"context": {}}, TypeError, "context must be a tensorstore.Context"),
    ],
)
def test_open_arguments(cache, kwargs, error, message):
    with pytest.raises(error, match=message):
        TokenCache.open(**{"path": cache.path, **kwargs})


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"field": ""}, ValueError, "field must not be empty"),
        ({"dtype": "float64"}, ValueError, "dtype must be an integer dtype"),
        ({"dtype": None}, TypeError, "dtype must be an integer dtype"),
        ({"if_exists": "replace"}, ValueError, "if_exists='replace' is not one of"),
        ({"metadata": "tok"}, TypeError, "metadata must be a mapping or None"),
        ({"flush_tokens": 0}, ValueError, r"flush_tokens must be >= 1 \(got flush_tokens=0\)"),
        ({"flush_tokens": 1e6}, TypeError, "flush_tokens must be an int"),
    ],
)
def test_writer_arguments(tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        CacheWriter(str(tmp_path / "w"), **kwargs)
    if "flush_tokens" not in kwargs:
        with pytest.raises(error, match=message):
            ShardedCacheWriter(str(tmp_path / "s"), **kwargs)


def test_writer_refuses_a_string_of_docs_and_bad_shard_names(tmp_path):
    writer = CacheWriter(str(tmp_path / "w"))
    with pytest.raises(TypeError, match="docs must be an iterable of token arrays"):
        writer.write("hello")
    sharded = ShardedCacheWriter(str(tmp_path / "s"))
    with pytest.raises(TypeError, match="name must be a str"):
        sharded.write_shard(3, iter(DOCS))
    with pytest.raises(ValueError, match=r"name must be a relative path .*got name='\.\./up'"):
        sharded.write_shard("../up", iter(DOCS))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"inputs": "a.txt"}, TypeError, "inputs must be a list of file paths"),
        ({"inputs": [3]}, TypeError, r"inputs\[0\] must be a non-empty str"),
        ({"dtype": "float32"}, ValueError, "dtype must be an integer dtype"),
        ({"text_docs": "para"}, ValueError, "text_docs='para' is not one of"),
        ({"if_exists": "yes"}, ValueError, "if_exists='yes' is not one of"),
        ({"batch_docs": 0}, ValueError, "batch_docs must be >= 1"),
        ({"progress": "no"}, TypeError, "progress must be a bool or None"),
        ({"tokenizer": "gpt2"}, TypeError, "tokenizer must provide encode_batch"),
    ],
)
def test_build_arguments(tmp_path, kwargs, error, message):
    text = tmp_path / "a.txt"
    text.write_text("hello\n")
    with pytest.raises(error, match=message):
        build_cache(str(tmp_path / "c"), **{"inputs": [str(text)], **kwargs})


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"max_bytes": 1.5e6}, TypeError, "max_bytes must be an int"),
        ({"max_bytes": -1}, ValueError, "max_bytes must be >= 1"),
        ({"max_bytes": 64, "block_tokens": "4"}, TypeError, "block_tokens must be an int"),
    ],
)
def test_block_cache_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        BlockCache(**kwargs)
