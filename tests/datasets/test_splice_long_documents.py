"""Splice schedules over documents near 2^31 tokens with strides near 2^30 and 2^31: every
row equals the naive enumeration (int32 sums there wrap: each of these failed before)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from splice_reference import ref_pairs

import meshbatch

LONG = 2**31 - 1  # the longest document check_lengths accepts


def rows_of(schedule):
    _, t, s, copy = (np.asarray(a) for a in schedule.lookup(np.arange(len(schedule))))
    return list(zip(t.tolist(), s.tolist(), copy.tolist(), strict=True))


@pytest.mark.parametrize(
    "length, stride",
    [(LONG, 2**30), (LONG, 2**31 - 3), (LONG - 1, 2**29 + 1), (LONG, 2**20), (LONG - 99, 2**20)],
)
def test_slide_within_long_document_equals_the_enumeration(length, stride):
    spec = dict(seq_len=8, content_length=4, content_start_mode="slide_within", content_stride=stride)
    want = ref_pairs(length, S=8, K=4, kt=stride, start_mode="slide_within")
    got = rows_of(meshbatch.splice_schedule([length], **spec))
    assert got == want
    assert all(s + copy <= 8 for _, s, copy in got)


@pytest.mark.parametrize("stride", [2**30, 2**31 - 3, 2**20])
def test_slide_within_long_document_shuffled_is_a_permutation_of_the_enumeration(stride):
    """``shuffle_content`` lays the starts out in rounds (``_first_with_more``): the same rows."""
    spec = dict(seq_len=8, content_length=4, content_start_mode="slide_within", content_stride=stride)
    want = ref_pairs(LONG, S=8, K=4, kt=stride, start_mode="slide_within")
    got = rows_of(meshbatch.splice_schedule([LONG], shuffle_content=True, key=jax.random.key(3), **spec))
    assert sorted(got) == sorted(want)


@pytest.mark.parametrize("stride", [2**30 - 1, 2**30, 2**31 - 3])
def test_coverage_balanced_weighted_with_a_stride_past_2_30(stride):
    """``alpha > 0`` with ``content_stride >= 2^30`` raised an OverflowError from jit; every row
    is a valid start ``t = k * stride <= L - K`` copying ``K`` tokens."""
    schedule = meshbatch.splice_schedule(
        [LONG],
        seq_len=8,
        content_length=4,
        alpha=0.5,
        content_start_mode="coverage_balanced",
        content_stride=stride,
    )
    rows = rows_of(schedule)
    starts = set(range(0, LONG - 4 + 1, stride))
    assert rows and all(t in starts and copy == 4 and s + copy <= 8 for t, s, copy in rows)
    assert {t for t, _, _ in rows} == starts  # both edges drawn: one start each side


def test_coverage_balanced_weighted_warns_past_float32_starts(caplog):
    """``alpha > 0`` over a document of more than 2^24 starts: the float32 CDF cannot tell its
    middle starts apart, which is logged naming the document (``alpha = 0`` is exact: no warning)."""
    lengths = [1000, 2**24 + 100]
    spec = dict(seq_len=8, content_length=4, content_start_mode="coverage_balanced", content_stride=1)
    with caplog.at_level("WARNING", logger="meshbatch.datasets.splice.tables"):
        meshbatch.splice_schedule(lengths, alpha=0.5, **spec)
    assert "document 1 has 16777313 starts" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="meshbatch.datasets.splice.tables"):
        meshbatch.splice_schedule(lengths, alpha=0.0, **spec)
    assert "starts" not in caplog.text
