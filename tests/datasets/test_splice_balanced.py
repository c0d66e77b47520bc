"""Coverage-balanced multi-document schedules: quotas, quantile starts, edge weighting, jitter."""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest
from splice_reference import ref_balanced_rows, ref_balanced_weights, ref_quotas

import meshbatch

LENGTHS = [1, 2, 3, 4, 7, 8, 13, 30]


def all_rows(schedule, epoch=0):
    doc, t, s, copy_len = schedule.lookup(np.arange(len(schedule), dtype=np.uint32), epoch)
    return list(zip(*(np.asarray(x).tolist() for x in (doc, t, s, copy_len)), strict=True))


def balanced(lengths, **spec):
    return meshbatch.splice_schedule(lengths, content_start_mode="coverage_balanced", **spec)


@pytest.mark.parametrize(
    ("seq_len", "content_length", "content_stride", "adaptive_k"),
    [
        (4, None, 1, True),
        (8, 3, 1, True),
        (8, 4, 2, False),
        (8, 6, 3, True),
        (5, 9, 1, False),
        (2, 2, 4, True),
    ],
)
def test_uniform_starts_equal_reference(seq_len, content_length, content_stride, adaptive_k):
    schedule = balanced(
        LENGTHS,
        seq_len=seq_len,
        content_length=content_length,
        content_stride=content_stride,
        adaptive_k=adaptive_k,
    )
    want = ref_balanced_rows(LENGTHS, S=seq_len, K=content_length, kt=content_stride, adaptive_k=adaptive_k)
    assert all_rows(schedule) == want  # by_coverage: every start exactly once, docs then t ascending


@pytest.mark.parametrize("epoch_length", [1, 5, 37, 1000])
def test_by_document_quotas_with_epoch_length(epoch_length):
    schedule = balanced(
        LENGTHS, seq_len=8, content_length=4, balance_mode="by_document", epoch_length=epoch_length
    )
    valid = [int(L >= 2) for L in LENGTHS]  # adaptive_k: K_i = min(4, L) >= min_copy_len = 2
    quotas = ref_quotas(valid, epoch_length)
    assert meshbatch.pairs_per_doc(schedule).tolist() == quotas
    want = ref_balanced_rows(LENGTHS, S=8, K=4, quotas=quotas)
    assert all_rows(schedule) == want


TEMPERATURE_LENGTHS = [45231, 43890, 12105, 8234, 5678, 3421, 1209]


@pytest.mark.parametrize("epoch_length", [1, 7, 1000, 99991])
@pytest.mark.parametrize("tau", [1.0, 0.0])
def test_temperature_one_is_length_proportional_and_zero_equal_per_document(tau, epoch_length):
    """``balance_tau=1`` shares the pairs in proportion to the lengths, ``0`` equally: the
    reference's quotas of those weights, each within 1 of its exact share."""
    weights = TEMPERATURE_LENGTHS if tau == 1.0 else [1] * len(TEMPERATURE_LENGTHS)
    schedule = balanced(
        TEMPERATURE_LENGTHS,
        seq_len=1024,
        balance_mode="by_temperature",
        balance_tau=tau,
        epoch_length=epoch_length,
    )
    quotas = meshbatch.pairs_per_doc(schedule)
    assert quotas.sum() == epoch_length
    assert quotas.tolist() == ref_quotas(weights, epoch_length)
    share = epoch_length * np.array(weights) / sum(weights)
    assert np.abs(quotas - share).max() < 1
    if tau == 0.0:
        assert quotas.max() - quotas.min() <= 1


def test_intermediate_temperature_and_default_epoch_length():
    schedule = balanced(TEMPERATURE_LENGTHS, seq_len=1024, balance_mode="by_temperature", balance_tau=0.7)
    quotas = meshbatch.pairs_per_doc(schedule)
    assert quotas.sum() == sum(L - 1024 + 1 for L in TEMPERATURE_LENGTHS)  # default epoch: one pass of starts
    weights = np.array(TEMPERATURE_LENGTHS, dtype=np.float64) ** 0.7
    assert np.abs(quotas - quotas.sum() * weights / weights.sum()).max() < 1
    assert (np.diff(quotas) < 0).all()  # softer than length-proportional, still ordered


def test_edge_weight_cdf_matches_reference():
    L, K, kt, alpha = 301, 16, 3, 0.8
    schedule = balanced([L], seq_len=16, content_length=K, content_stride=kt, alpha=alpha)
    placement = schedule.placement
    _, weights = ref_balanced_weights(L, K, kt=kt, alpha=alpha)
    k = np.arange(len(weights) + 1)
    cumulative = jax.jit(lambda p, doc, k: p.cumulative(doc, k))
    got = np.asarray(cumulative(placement, np.zeros_like(k, dtype=np.int32), k.astype(np.int32)))
    want = np.concatenate([[0.0], np.cumsum(weights)])
    np.testing.assert_allclose(got, want, rtol=2e-6)


@pytest.mark.parametrize(("alpha", "content_stride"), [(0.8, 1), (1.0, 2), (0.3, 5)])
def test_weighted_starts_match_reference(alpha, content_stride):
    lengths = [40, 97, 16, 250]
    schedule = balanced(lengths, seq_len=16, content_length=12, content_stride=content_stride, alpha=alpha)
    got = all_rows(schedule)
    want = ref_balanced_rows(lengths, S=16, K=12, kt=content_stride, alpha=alpha)
    assert len(got) == len(want)
    diff = [abs(a[1] - b[1]) for a, b in zip(got, want, strict=True)]
    # float32 CDF vs float64: a quantile exactly on a step boundary may land one start over.
    assert max(diff) <= content_stride and sum(d > 0 for d in diff) <= len(diff) // 100 + 1
    assert [r[0] for r in got] == [r[0] for r in want]


def test_alpha_raises_edge_coverage():
    """Windows near either document edge are drawn more often, so edge tokens are covered more."""
    lengths, K = [400], 32
    flat = balanced(lengths, seq_len=K, content_length=K)
    coverage = {0.0: meshbatch.coverage_counts(flat, 0)}
    for alpha in (0.5, 0.8):
        coverage[alpha] = meshbatch.coverage_counts(
            balanced(lengths, seq_len=K, content_length=K, alpha=alpha), 0
        )
        assert len(balanced(lengths, seq_len=K, content_length=K, alpha=alpha)) == len(flat)  # same epoch
    for alpha in (0.5, 0.8):
        assert coverage[alpha].sum() == coverage[0.0].sum()  # same rows, same tokens copied
        for edge in (slice(0, 8), slice(-8, None)):  # both edges
            assert (coverage[alpha][edge] > coverage[0.0][edge]).all(), alpha
        middle = slice(150, 250)
        assert coverage[alpha][middle].mean() < coverage[0.0][middle].mean()
    assert coverage[0.8][0] > coverage[0.5][0] > coverage[0.0][0] == 1  # grows with alpha


def test_low_discrepancy_jitter_is_balanced_and_rotates():
    lengths = [40, 9, 25]
    schedule = balanced(lengths, seq_len=16, content_length=8, offset_jitter=3, jitter_mode="low_discrepancy")
    epoch0 = np.array(all_rows(schedule, 0))
    epoch1 = np.array(all_rows(schedule, 1))
    for doc in range(3):
        rows = epoch0[epoch0[:, 0] == doc]
        jitter = 16 - rows[:, 3] - rows[:, 2]  # s = S - K_i - j
        assert set(jitter.tolist()) <= set(range(4))
        counts = np.bincount(jitter, minlength=4)
        assert counts.max() - counts.min() <= 1
    np.testing.assert_array_equal(epoch1[:, :2], epoch0[:, :2])  # same starts
    np.testing.assert_array_equal(
        (16 - epoch1[:, 3] - epoch1[:, 2]), (16 - epoch0[:, 3] - epoch0[:, 2] + 1) % 4
    )


def test_jitter_never_pushes_s_below_zero(caplog):
    with caplog.at_level(logging.WARNING, logger="meshbatch.datasets.splice"):
        schedule = balanced(
            [50, 6], seq_len=8, content_length=8, offset_jitter=2, jitter_mode="low_discrepancy"
        )  # doc 0: K_0 = S, no room; doc 1: K_1 = 6, room for 2
    rows = np.concatenate([np.array(all_rows(schedule, epoch)) for epoch in range(3)])
    assert (rows[rows[:, 0] == 0][:, 2] == 0).all()
    assert rows[rows[:, 0] == 1][:, 2].tolist() == [2, 1, 0]  # its one start, rotated per epoch
    assert "offset_jitter=2: 1 documents" in caplog.text


def test_uniform_jitter_is_seeded_and_spread():
    spec = dict(seq_len=32, content_length=16, offset_jitter=4, jitter_mode="uniform")
    first = np.array(all_rows(balanced([3000], key=jax.random.key(1), **spec)))
    again = np.array(all_rows(balanced([3000], key=jax.random.key(1), **spec)))
    other = np.array(all_rows(balanced([3000], key=jax.random.key(2), **spec)))
    np.testing.assert_array_equal(first, again)
    assert (first[:, 2] != other[:, 2]).mean() > 0.5
    counts = np.bincount(32 - 16 - first[:, 2], minlength=5)
    assert counts.shape == (5,) and counts.min() > 0.15 * len(first)  # each of 5 placements ~20%
    next_epoch = np.array(all_rows(balanced([3000], key=jax.random.key(1), **spec), epoch=1))
    assert (next_epoch[:, 2] != first[:, 2]).mean() > 0.5


def test_doc_idx_and_frames_follow_the_schedule():
    docs = [np.arange(L) + 1000 * i for i, L in enumerate([12, 3, 30])]
    spec = dict(seq_len=10, content_length=6, content_start_mode="coverage_balanced", pad_token_id=-1)
    data = meshbatch.SpliceDataset(docs, **spec)
    batch = data.get_batch(np.arange(len(data)))
    doc, t, s, copy_len = (np.asarray(x) for x in data.schedule.lookup(np.arange(len(data))))
    np.testing.assert_array_equal(np.asarray(batch.doc_idx), doc)
    tokens = np.asarray(batch.tokens)
    for row in range(len(data)):
        assert (
            tokens[row, s[row] : s[row] + copy_len[row]].tolist()
            == docs[doc[row]][t[row] : t[row] + 6].tolist()
        )
        assert s[row] + copy_len[row] == 10  # right-aligned, no jitter
