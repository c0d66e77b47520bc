"""Document selection from lengths alone: thresholds, policies, doc_index/doc_key, fallbacks, subset."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import meshbatch

LENGTHS = np.array([5, 40, 12, 40, 7, 30, 1, 12], dtype=np.int64)


def select(**kw):
    return meshbatch.select_documents(LENGTHS, **kw)


@pytest.mark.parametrize(
    ("mode", "want"),
    [("first", [1, 2, 3]), ("longest", [1, 3, 5]), ("shortest", [2, 7, 5])],
)
def test_policies_among_candidates(mode, want):
    chosen = select(num_docs=3, min_doc_length=10, doc_select_mode=mode)
    assert chosen.indices.tolist() == want  # ties broken by cache index
    assert chosen.lengths.tolist() == LENGTHS[want].tolist()


def test_thresholds_are_inclusive():
    chosen = select(num_docs=8, min_doc_length=12, max_doc_length=30, doc_select_mode="first")
    assert chosen.indices.tolist() == [2, 5, 7]


def test_doc_index_is_honoured_when_it_qualifies(caplog):
    with caplog.at_level(logging.INFO, logger="meshbatch.datasets.splice.selection"):
        chosen = select(doc_index=4, min_doc_length=5)
    assert chosen.indices.tolist() == [4]
    assert chosen.reason == "doc_index=4 honoured"
    assert "[multi_splice] Selected doc_idx=4, length=7" in caplog.text


def test_doc_index_violating_thresholds_falls_back_to_the_policy():
    chosen = select(doc_index=4, min_doc_length=10, doc_select_mode="shortest")
    assert chosen.indices.tolist() == [2]
    assert chosen.reason.startswith("doc_index=4 (length 7) violates the length thresholds; fell back to")


def test_no_candidate_falls_back_to_the_longest_overall():
    chosen = select(min_doc_length=100, doc_select_mode="shortest")
    assert chosen.indices.tolist() == [1]
    assert "fell back to the longest overall" in chosen.reason
    assert select(num_docs=2, min_doc_length=100).indices.tolist() == [1, 3]


def test_random_policy_is_reproducible_and_distinct():
    first = select(num_docs=4, min_doc_length=2, doc_select_mode="random")
    again = select(num_docs=4, min_doc_length=2, doc_select_mode="random")
    assert first.indices.tolist() == again.indices.tolist()
    assert len(set(first.indices.tolist())) == 4
    assert set(first.indices.tolist()) <= {0, 1, 2, 3, 4, 5, 7}
    picks = {
        tuple(select(num_docs=3, doc_select_mode="random", key=_key(k)).indices.tolist()) for k in range(8)
    }
    assert len(picks) > 1  # the key matters
    everything = select(num_docs=20, doc_select_mode="random")
    assert sorted(everything.indices.tolist()) == list(range(8))


def _key(seed):
    import jax

    return jax.random.key(seed)


def test_doc_key_filters_by_key_or_predicate():
    keys = [f"doc-{i}" for i in range(len(LENGTHS))]
    assert select(doc_key="doc-5", doc_keys=keys).indices.tolist() == [5]
    chosen = select(num_docs=3, doc_key=lambda k: int(k[4:]) % 2 == 1, doc_keys=keys, doc_select_mode="first")
    assert chosen.indices.tolist() == [1, 3, 5]
    with pytest.raises(ValueError, match="doc_key='nope' matches no document"):
        select(doc_key="nope", doc_keys=keys)
    with pytest.raises(ValueError, match="doc_key='doc-5' needs doc_keys"):
        select(doc_key="doc-5")


def test_training_subset_keeps_documents_inside_the_trained_prefix():
    # cutoff = 2 batches * 4 sequences * 8 tokens = 64; cumulative ends 5, 45, 57, 97, ... -> docs 0..2.
    kw = dict(restrict_to_training_subset=True, max_train_batches=2, initial_batch_size=4, seq_len=8)
    assert select(num_docs=8, doc_select_mode="first", **kw).indices.tolist() == [0, 1, 2]
    fallback = select(doc_index=5, **kw)
    assert fallback.indices.tolist() == [1]
    assert "outside the training subset" in fallback.reason
    with pytest.raises(ValueError, match="needs a positive int initial_batch_size"):
        select(restrict_to_training_subset=True, max_train_batches=2, seq_len=8)


def test_fewer_candidates_than_requested_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="meshbatch.datasets.splice.selection"):
        chosen = select(num_docs=5, min_doc_length=30)
    assert chosen.indices.tolist() == [1, 3, 5]
    assert "num_docs=5 but only 3 documents qualify" in caplog.text


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (dict(doc_index=8), ValueError, "doc_index=8 is out of range for 8 documents"),
        (dict(doc_index=-1), ValueError, "doc_index=-1 is out of range for 8 documents"),
        (dict(doc_index=1.5), TypeError, "doc_index must be an int"),
        (dict(doc_index=1, num_docs=2), ValueError, "doc_index selects one document"),
        (dict(doc_select_mode="median"), ValueError, "doc_select_mode='median' is not one of"),
        (dict(num_docs=0), ValueError, r"num_docs must be >= 1 \(got num_docs=0\)"),
        (dict(min_doc_length=10, max_doc_length=5), ValueError, "min_doc_length=10 > max_doc_length=5"),
    ],
)
def test_bad_selection_input_names_the_value(kw, error, match):
    with pytest.raises(error, match=match):
        select(**kw)


def test_selection_never_needs_tokens():
    # Only lengths go in; a cache of 10^6 documents selects without touching token data.
    lengths = np.random.default_rng(0).integers(0, 100_000, 1_000_000)
    chosen = meshbatch.select_documents(lengths, num_docs=10, min_doc_length=1024, max_doc_length=50_000)
    assert (lengths[chosen.indices] <= 50_000).all() and (lengths[chosen.indices] >= 1024).all()
    assert chosen.lengths.tolist() == sorted(chosen.lengths.tolist(), reverse=True)
