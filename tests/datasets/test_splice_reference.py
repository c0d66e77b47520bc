"""The splice reference (``splice_reference.py``) reproduces the seed's worked examples."""

import numpy as np
import pytest
from splice_reference import P, ref_frame, ref_pairs, ref_pass_order, ref_quotas

# --- the reference reproduces the seed's worked examples --------------------------------------


def test_reference_example_a_lists_13_pairs():
    pairs = ref_pairs(5, S=5, K=3, start_mode="slide_within")
    assert [(t, s) for t, s, _ in pairs] == [(t, s) for t in range(3) for s in range(3)] + [
        (3, s) for s in range(4)
    ]


def test_reference_frame_suffix_splice():
    tokens, loss, seg = ref_frame(np.arange(5), 1, 0, 2, S=5)
    assert tokens.tolist() == [1, 2, P, P, P]
    assert loss.tolist() == [1, 0, 0, 0, 0]
    assert seg.tolist() == [1, 1, 1, 1, 1]


def test_reference_pass_order_replicates_like_the_seed():
    assert ref_pass_order(4, 2) == [0, 2, 1, 3]
    assert sorted(ref_pass_order(7, 3)) == list(range(7))


@pytest.mark.parametrize(("weights", "total", "want"), [([1, 1, 1], 10, [4, 3, 3]), ([3, 1], 5, [4, 1])])
def test_reference_quotas(weights, total, want):
    assert ref_quotas(weights, total) == want
