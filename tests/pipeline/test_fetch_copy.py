"""fetch's per-device copy (``copy_spans``): a slice per run of adjacent spans, or one gather
when runs are short; both equal the spans concatenated, whatever the spans."""

import numpy as np
import pytest

from meshbatch.pipeline.fetch import MIN_RUN_TOKENS, copy_spans


def reference(source, starts, lengths):
    return np.concatenate([source[s : s + n] for s, n in zip(starts, lengths, strict=True)] + [source[:0]])


def test_docstring_trace():
    out = np.full(5, -1, np.int32)
    copy_spans(np.arange(6, dtype=np.int32), np.array([2, 4, 0]), np.array([2, 2, 1]), out)
    assert out.tolist() == [2, 3, 4, 5, 0]


@pytest.mark.parametrize("mean_length", [3, 4 * MIN_RUN_TOKENS])  # the gather, the slice copies
@pytest.mark.parametrize("seed", range(3))
def test_spans_are_copied_back_to_back(seed, mean_length):
    rng = np.random.default_rng(seed)
    source = rng.integers(0, 1 << 30, size=20 * mean_length + 50, dtype=np.int32)
    lengths = rng.integers(0, 2 * mean_length, size=40)
    lengths[rng.random(40) < 0.2] = 0  # empty span slots are skipped
    starts = rng.integers(0, source.size - lengths)
    adjacent = rng.random(40) < 0.5  # many spans follow their predecessor in the source
    for i in np.flatnonzero(adjacent[1:]) + 1:
        starts[i] = min(starts[i - 1] + lengths[i - 1], source.size - lengths[i])
    want = reference(source, starts, lengths)
    out = np.full(want.size, -1, np.int32)
    copy_spans(source, starts, lengths, out)
    np.testing.assert_array_equal(out, want)


def test_no_spans_copy_nothing():
    out = np.zeros(0, np.int32)
    copy_spans(np.arange(4, dtype=np.int32), np.array([1, 2]), np.array([0, 0]), out)
    assert out.size == 0
