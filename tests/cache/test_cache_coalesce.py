"""Coalesced reads: the [3, 1, 2, 2, 4, 9, 8] contract, a property test against a naive per-span
reference, counters, and span validation."""

import numpy as np
import pytest

from meshbatch.cache import CacheWriter, TokenCache, coalesce_spans
from meshbatch.cache.read.coalesce import as_spans

SEQ_LEN = 16


@pytest.fixture(scope="module")
def flat_cache(tmp_path_factory):
    """A cache whose token at global offset t is t (as int32), in 37 rows of varying length."""
    path = str(tmp_path_factory.mktemp("flat"))
    lengths = np.random.default_rng(0).integers(0, 40, size=37)
    ends = np.cumsum(lengths)
    with CacheWriter(path) as writer:
        writer.write(np.arange(end - n, end, dtype=np.int32) for n, end in zip(lengths, ends, strict=True))
    return TokenCache.open(path)


def test_seq_len_strided_rows_cost_two_reads_in_request_order(flat_cache):
    rows = np.array([3, 1, 2, 2, 4, 9, 8])
    flat_cache.counters.reset()
    got = flat_cache.read_spans(rows * SEQ_LEN, np.full(rows.shape, SEQ_LEN))

    assert flat_cache.counters.as_dict() == {
        "spans_requested": 7,
        "unique_spans": 6,
        "runs": 2,
        "reads_issued": 2,
        "bytes_read": 6 * SEQ_LEN * 4,
    }
    assert len(got) == 7
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(got[i], np.arange(row * SEQ_LEN, (row + 1) * SEQ_LEN, dtype=np.int32))
    np.testing.assert_array_equal(got.offsets, np.arange(8) * SEQ_LEN)
    assert got.tokens.dtype == np.int32


def test_read_runs_exposes_unique_runs_and_span_positions(flat_cache):
    rows = np.array([3, 1, 2, 2, 4, 9, 8])
    runs = flat_cache.read_runs(rows * SEQ_LEN, SEQ_LEN)
    np.testing.assert_array_equal(runs.run_starts, [1 * SEQ_LEN, 8 * SEQ_LEN])
    np.testing.assert_array_equal(runs.run_offsets, [0, 4 * SEQ_LEN, 6 * SEQ_LEN])
    np.testing.assert_array_equal(runs.span_starts, np.array([2, 0, 1, 1, 3, 5, 4]) * SEQ_LEN)
    np.testing.assert_array_equal(runs.buffer[: 4 * SEQ_LEN], np.arange(SEQ_LEN, 5 * SEQ_LEN))
    np.testing.assert_array_equal(runs.buffer[4 * SEQ_LEN :], np.arange(8 * SEQ_LEN, 10 * SEQ_LEN))


def _naive_runs(starts, lengths):
    covered = sorted({t for s, n in zip(starts, lengths, strict=True) for t in range(s, s + n)})
    runs = []
    for t in covered:
        if runs and runs[-1][1] == t:
            runs[-1][1] = t + 1
        else:
            runs.append([t, t + 1])
    return runs


@pytest.mark.parametrize("seed", range(40))
def test_random_span_sets_match_naive_reference(flat_cache, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 30))
    total = flat_cache.num_tokens
    starts = rng.integers(0, total, size=n)
    lengths = np.minimum(rng.integers(0, 60, size=n), total - starts)
    if n and seed % 3 == 0:  # force duplicates and exact adjacency
        starts[n // 2 :] = starts[: n - n // 2]
        starts[0] = min(starts[-1] + lengths[-1], total - 1)
        lengths = np.minimum(lengths, total - starts)

    coalesced = coalesce_spans(*as_spans(starts, lengths))
    expected_runs = _naive_runs(starts.tolist(), lengths.tolist())
    got_runs = [
        [s, s + n] for s, n in zip(coalesced.run_starts.tolist(), coalesced.run_lengths.tolist(), strict=True)
    ]
    assert got_runs == expected_runs
    assert coalesced.unique_spans == len({(s, n) for s, n in zip(starts, lengths, strict=True) if n > 0})

    flat_cache.counters.reset()
    got = flat_cache.read_spans(starts, lengths)
    for i, (s, n) in enumerate(zip(starts, lengths, strict=True)):
        np.testing.assert_array_equal(got[i], np.arange(s, s + n, dtype=np.int32))  # naive: token t is t
    assert flat_cache.counters.reads_issued == len(expected_runs)
    assert flat_cache.counters.bytes_read == 4 * sum(b - a for a, b in expected_runs)


def test_counters_accumulate_and_reset(flat_cache):
    flat_cache.counters.reset()
    flat_cache.read_spans([0, 100], [10, 10])
    flat_cache.read_spans([5], [10])
    assert flat_cache.counters.as_dict() == {
        "spans_requested": 3,
        "unique_spans": 3,
        "runs": 3,
        "reads_issued": 3,
        "bytes_read": 30 * 4,
    }
    flat_cache.counters.reset()
    assert set(flat_cache.counters.as_dict().values()) == {0}


def test_empty_request_and_empty_spans(flat_cache):
    got = flat_cache.read_spans(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(got) == 0 and got.tokens.shape == (0,) and got.tokens.dtype == np.int32
    got = flat_cache.read_spans([7, 7], [0, 3])
    assert got[0].size == 0
    np.testing.assert_array_equal(got[1], [7, 8, 9])


def test_span_beyond_num_tokens_raises_index_error_naming_it(flat_cache):
    n = flat_cache.num_tokens
    with pytest.raises(
        IndexError, match=rf"span 1 \(start={n - 2}, length=5\) ends at token {n + 3} > num_tokens={n}"
    ):
        flat_cache.read_spans([0, n - 2], [4, 5])


@pytest.mark.parametrize(
    "starts, lengths, message",
    [
        ([0, -1], [1, 1], r"starts must be >= 0 \(got starts\[1\]=-1\)"),
        ([0, 1], [1, -3], r"lengths must be >= 0 \(got lengths\[1\]=-3\)"),
        ([[0, 1]], [[1, 1]], "must be 1-D"),
        ([0, 1], [1, 2, 3], "must be 1-D of equal length"),
    ],
)
def test_malformed_spans_are_rejected(flat_cache, starts, lengths, message):
    with pytest.raises(ValueError, match=message):
        flat_cache.read_spans(starts, lengths)


@pytest.mark.parametrize(
    "starts, lengths, message",
    [
        ([0.5], [1], r"starts must be integers \(got dtype float64\)"),
        ([0], [2.0], r"lengths must be integers \(got dtype float64\)"),
        ("0,1", [1, 1], "starts must be integers \\(got a str"),
        ([True], [1], r"starts must be integers \(got dtype bool\)"),
        ([None], [1], r"starts must be integers \(got dtype object\)"),
    ],
)
def test_non_integer_spans_are_type_errors(flat_cache, starts, lengths, message):
    with pytest.raises(TypeError, match=message):
        flat_cache.read_spans(starts, lengths)


def test_read_rows_returns_whole_documents_in_order(flat_cache):
    offsets = flat_cache.doc_offsets()
    rows = [5, 0, 36, 5]
    got = flat_cache.read_rows(rows)
    for row, tokens in zip(rows, got, strict=True):
        np.testing.assert_array_equal(tokens, np.arange(offsets[row], offsets[row + 1], dtype=np.int32))
    with pytest.raises(IndexError, match=r"row 37 out of range .* of 37 rows"):
        flat_cache.read_rows([1, 37])


def test_spans_back_to_back_in_request_order_are_returned_without_a_gather(flat_cache):
    runs = flat_cache.read_runs(np.arange(0, 320, 32), 32)
    assert runs.spans().tokens is runs.buffer
    np.testing.assert_array_equal(runs.spans().tokens, np.arange(320, dtype=np.int32))


@pytest.mark.parametrize("seed", range(4))
def test_few_spans_coalesce_as_many_do(seed, monkeypatch):
    """Up to ``SMALL_SPANS`` spans take a plain-Python path: the same runs, offsets, span places
    and unique count as the numpy path, over random span sets (overlaps, duplicates, touching and
    empty spans)."""
    from meshbatch.cache.read import coalesce

    rng = np.random.default_rng(seed)
    for _ in range(500):
        n = int(rng.integers(0, coalesce.SMALL_SPANS + 1))
        starts = rng.integers(0, 120, n).astype(np.int64)
        lengths = rng.integers(0, 25, n).astype(np.int64) * (rng.random(n) > 0.15)
        few = coalesce_spans(starts, lengths)
        with monkeypatch.context() as m:
            m.setattr(coalesce, "SMALL_SPANS", -1)
            many = coalesce_spans(starts, lengths)
        for field in ("run_starts", "run_lengths", "run_offsets", "span_starts"):
            a, b = getattr(few, field), getattr(many, field)
            assert a.dtype == b.dtype and np.array_equal(a, b), (field, starts, lengths)
        assert few.unique_spans == many.unique_spans
