"""Every worked example of ``splice-document-dataset.md``, literally, through the public API."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import meshbatch

P = -1  # the seed's "Null"
DOC = np.arange(5)  # doc = [0, 1, 2, 3, 4], L = 5


def frames(batch):
    return (
        np.asarray(batch.tokens).tolist(),
        np.asarray(batch.loss_mask).tolist(),
        np.asarray(batch.segment_ids).tolist(),
    )


def test_whole_doc_splice_original_behaviour():
    # K = L (clamped), t = 0; s = 0, 1, 2 -> copy_len = 5, 4, 3.
    data = meshbatch.SpliceDataset([DOC], seq_len=5, content_length=5, pad_token_id=P)
    tokens, loss, seg = frames(data.frames_at([0, 0, 0], [0, 0, 0], [0, 1, 2]))
    assert tokens == [[0, 1, 2, 3, 4], [P, 0, 1, 2, 3], [P, P, 0, 1, 2]]
    assert loss == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 0]]
    assert seg == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    # The schedule (anchor_start) keeps the whole document in frame: s in [0, S - L] = [0].
    schedule = meshbatch.splice_schedule([5], seq_len=5)
    assert [np.asarray(x).tolist() for x in schedule.lookup(np.arange(len(schedule)))] == [[0], [0], [0], [5]]


def test_anchor_start_never_yields_a_later_start():
    # "This never yields [1,2,Null,Null,Null] because content always starts at t=0."
    for content_length in (2, 3, None):
        data = meshbatch.SpliceDataset([DOC], seq_len=5, content_length=content_length, pad_token_id=P)
        tokens = np.asarray(data.get_batch(np.arange(len(data))).tokens)
        assert [1, 2, P, P, P] not in tokens.tolist()
        assert (tokens[tokens != P].min()) == 0


def test_suffix_splice_k2_t1_s0():
    data = meshbatch.SpliceDataset([DOC], seq_len=5, content_length=2, pad_token_id=P)
    assert frames(data.frames_at(0, 1, 0))[:2] == ([[1, 2, P, P, P]], [[1, 0, 0, 0, 0]])


def test_suffix_splice_with_absolute_shift_k3_t2_s1():
    data = meshbatch.SpliceDataset([DOC], seq_len=5, content_length=3, pad_token_id=P)
    tokens, loss, seg = frames(data.frames_at(0, 2, 1))
    assert tokens == [[P, 2, 3, 4, P]]
    assert loss == [[0, 1, 1, 0, 0]]
    assert seg == [[0, 1, 1, 1, 1]]


EXAMPLE_A = [
    [0, 1, 2, P, P], [P, 0, 1, 2, P], [P, P, 0, 1, 2],
    [1, 2, 3, P, P], [P, 1, 2, 3, P], [P, P, 1, 2, 3],
    [2, 3, 4, P, P], [P, 2, 3, 4, P], [P, P, 2, 3, 4],
    [3, 4, P, P, P], [P, 3, 4, P, P], [P, P, 3, 4, P], [P, P, P, 3, 4],
]  # fmt: skip


def test_example_a_slide_within_yields_exactly_13_frames_in_order():
    spec = dict(seq_len=5, content_length=3, content_start_mode="slide_within", pad_token_id=P)
    schedule = meshbatch.splice_schedule([5], **spec)
    assert len(schedule) == 13 == 3 + 3 + 3 + 4 + 0  # the seed's count
    doc, t, s, copy_len = (np.asarray(x).tolist() for x in schedule.lookup(np.arange(13)))
    assert doc == [0] * 13
    want = [(t, s) for t in range(3) for s in range(3)] + [(3, s) for s in range(4)]
    assert list(zip(t, s, strict=True)) == want
    assert copy_len == [3] * 9 + [2] * 4
    tokens, loss, seg = frames(meshbatch.splice_batch([DOC], np.arange(13), **spec))
    assert tokens == EXAMPLE_A
    for row, (frame, mask, segs) in enumerate(zip(tokens, loss, seg, strict=True)):
        doc_pos = [i for i, x in enumerate(frame) if x != P]
        assert mask == [int(i in doc_pos[:-1]) for i in range(5)], row
        assert segs == [int(i >= s[row]) for i in range(5)], row


def test_example_b_exact_user_slice_k2():
    spec = dict(seq_len=5, content_length=2, content_start_mode="slide_within", pad_token_id=P)
    assert len(meshbatch.splice_schedule([5], **spec)) == 4 * 4  # t = 0..3, s = 0..3; t = 4 pruned
    tokens, loss, _ = frames(meshbatch.splice_batch([DOC], [4, 5, 6, 7], **spec))  # the t = 1 block
    assert tokens == [[1, 2, P, P, P], [P, 1, 2, P, P], [P, P, 1, 2, P], [P, P, P, 1, 2]]
    assert loss[0] == [1, 0, 0, 0, 0]


def test_combined_coverage_pairs_are_in_the_k3_schedule():
    # The seed's illustrative list is a subset of Example A's 13 pairs (see docs/splice.md).
    schedule = meshbatch.splice_schedule([5], seq_len=5, content_length=3, content_start_mode="slide_within")
    _, t, s, copy_len = (np.asarray(x) for x in schedule.lookup(np.arange(len(schedule))))
    pairs = set(zip(t.tolist(), s.tolist(), strict=True))
    assert {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)} <= pairs
    assert copy_len.min() >= 2


def test_tiny_doc_offsets_0_to_2():
    # "build a tiny fake doc (e.g., [1,2,3]) and S=5, verify tokens, loss_mask, and segment_ids
    # for offsets 0..2"
    tokens, loss, seg = frames(
        meshbatch.splice_batch([np.array([1, 2, 3])], [0, 1, 2], seq_len=5, pad_token_id=P)
    )
    assert tokens == [[1, 2, 3, P, P], [P, 1, 2, 3, P], [P, P, 1, 2, 3]]
    assert loss == [[1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0]]
    assert seg == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 1, 1, 1]]


A_TO_Z = {c: ord(c) for c in "ABCDEFGHIJKLXYZ"}
MULTI_DOCS = [np.array([A_TO_Z[c] for c in doc]) for doc in ("ABCDEFG", "HIJKL", "XYZ")]
MULTI_SPEC = dict(seq_len=8, content_length=4, content_start_mode="coverage_balanced", adaptive_k=False)


def test_by_document_worked_example():
    # num_docs=3, S=8, K=4, content_stride=1, balance_mode="by_document" (no adaptive_k in that example).
    spec = dict(MULTI_SPEC, balance_mode="by_document")
    schedule = meshbatch.splice_schedule([7, 5, 3], **spec)
    assert len(schedule) == 8
    doc, t, s, _ = (np.asarray(x).tolist() for x in schedule.lookup(np.arange(8)))
    assert list(zip(doc, t, s, strict=True)) == [
        (0, 0, 4), (0, 1, 4), (0, 2, 4), (0, 3, 4),
        (1, 0, 4), (1, 1, 4), (1, 0, 4), (1, 1, 4),
    ]  # fmt: skip
    assert meshbatch.pairs_per_doc(schedule).tolist() == [4, 4, 0]
    batch = meshbatch.splice_batch(MULTI_DOCS, [4, 5], pad_token_id=P, **spec)
    h, i, j, k, l = (A_TO_Z[c] for c in "HIJKL")  # noqa: E741
    assert np.asarray(batch.tokens).tolist() == [[P, P, P, P, h, i, j, k], [P, P, P, P, i, j, k, l]]
    assert np.asarray(batch.loss_mask).tolist() == [[0, 0, 0, 0, 1, 1, 1, 0]] * 2
    assert np.asarray(batch.segment_ids).tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]] * 2
    assert np.asarray(batch.doc_idx).tolist() == [1, 1]


def test_by_coverage_respects_length_proportions():
    schedule = meshbatch.splice_schedule([7, 5, 3], **dict(MULTI_SPEC, balance_mode="by_coverage"))
    assert meshbatch.pairs_per_doc(schedule).tolist() == [4, 2, 0]


def test_by_coverage_vs_by_document_10k_5k_2k():
    # Lengths [10K, 5K, 2K], S = K = 4096: by_document gives every document the largest count.
    spec = dict(seq_len=4096, content_length=4096, content_start_mode="coverage_balanced")
    coverage = meshbatch.pairs_per_doc(meshbatch.splice_schedule([10_000, 5_000, 2_000], **spec))
    document = meshbatch.pairs_per_doc(
        meshbatch.splice_schedule([10_000, 5_000, 2_000], balance_mode="by_document", **spec)
    )
    assert coverage.tolist() == [10_000 - 4096 + 1, 5_000 - 4096 + 1, 1]  # adaptive_k: K_2 = 2000
    assert document.tolist() == [coverage.max()] * 3


def test_debug_summary_is_logged(caplog):
    lengths = [45231, 43890, 42105, 38234, 35678, 33421, 31209, 29834, 28456, 27891]
    with caplog.at_level(logging.INFO, logger="meshbatch.datasets.splice"):
        schedule = meshbatch.splice_schedule(
            lengths,
            seq_len=4096,
            content_length=4096,
            content_start_mode="coverage_balanced",
            balance_mode="by_document",
        )
    text = caplog.text
    assert f"[multi_splice] num_docs=10 doc_lengths={lengths}".replace("'", "") in text
    assert "Pos.size=4096 content_length=4096 mode=coverage_balanced" in text
    assert f"balance_mode=by_document total_pairs={len(schedule)}" in text
    assert f"[multi_splice] pairs_per_doc={[45231 - 4095] * 10}" in text


def test_by_temperature_summary_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="meshbatch.datasets.splice"):
        meshbatch.splice_schedule(
            [4000, 2000, 1000], seq_len=512, content_start_mode="coverage_balanced",
            balance_mode="by_temperature", balance_tau=0.7,
        )  # fmt: skip
    assert "[multi_splice] doc_probs ~ length^0.7 normalized" in caplog.text
    assert "[multi_splice] expected_doc_fraction=[" in caplog.text


@pytest.mark.parametrize("window_stride", [1, 3])
def test_slide_mode_is_classic_sliding_windows(window_stride):
    doc = np.arange(11) + 100
    data = meshbatch.SpliceDataset(
        [doc], seq_len=4, mode="slide", window_stride=window_stride, pad_token_id=P
    )
    starts = list(range(0, 11 - 4 + 1, window_stride))  # w = 0..(L - S) with stride k_window
    assert len(data) == len(starts)
    tokens, loss, _ = frames(data.get_batch(np.arange(len(data))))
    assert tokens == [doc[w : w + 4].tolist() for w in starts]
    assert loss == [[1, 1, 1, 0]] * len(starts)  # standard causal loss over all S tokens
