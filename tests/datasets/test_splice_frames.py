"""splice_frames / pool_frames: golden rows, properties against the numpy reference, Levanter parity."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from shape_checks import unchecked
from splice_reference import ref_frame

from meshbatch.datasets.splice.tables import document_pool
from meshbatch.kernels import cyclic_read_split, pool_frames, splice_frames

P = -1


def as32(x):
    return jnp.asarray(x, dtype=jnp.int32)


def test_golden_module_docstring_trace():
    # Pinned: the trace in kernels/splice/frames.py's docstring and docs/splice.md rely on this row.
    pool = document_pool([np.arange(5)])
    batch = pool_frames(pool, as32([0]), as32([1]), as32([2]), as32([3]), seq_len=5, pad_token_id=P)
    assert np.asarray(batch.tokens).tolist() == [[P, P, 1, 2, 3]]
    assert np.asarray(batch.loss_mask).tolist() == [[0, 0, 1, 1, 0]]
    assert np.asarray(batch.segment_ids).tolist() == [[0, 0, 1, 1, 1]]
    assert np.asarray(batch.doc_idx).tolist() == [0]
    eos = pool_frames(
        pool, as32([0]), as32([1]), as32([2]), as32([3]), seq_len=5, pad_token_id=P, eos_token_id=99
    )
    assert np.asarray(eos.tokens).tolist() == [[P, 99, 1, 2, 3]]
    isolate = pool_frames(
        pool, as32([0]), as32([1]), as32([1]), as32([3]), seq_len=5, pad_token_id=P, segment_mode="isolate"
    )
    assert np.asarray(isolate.segment_ids).tolist() == [[0, 1, 1, 1, 0]]


def random_rows(rng, docs, seq_len, n, *, cyclic=False):
    """Valid random ``(doc, t, s, copy_len)`` rows, including copy_len 0 and 1 and full frames."""
    doc = rng.integers(0, len(docs), n)
    lengths = np.array([len(d) for d in docs])[doc]
    t = rng.integers(0, np.maximum(lengths, 1))
    s = rng.integers(0, seq_len, n)
    room = np.minimum(lengths if cyclic else lengths - t, seq_len - s)
    copy_len = rng.integers(0, room + 1)
    return doc, t, s, copy_len


DOCS = [np.arange(1) + 10, np.arange(2) + 20, np.arange(3) + 30, np.arange(17) + 100, np.arange(64) + 1000]


@pytest.mark.parametrize("seq_len", [1, 2, 3, 17])
@pytest.mark.parametrize("cyclic", [False, True])
@pytest.mark.parametrize(("eos", "segment_mode"), [(None, "prefix"), (7, "prefix"), (None, "isolate")])
def test_pool_frames_equal_reference(seq_len, cyclic, eos, segment_mode):
    rng = np.random.default_rng(seq_len * 7 + cyclic)
    doc, t, s, copy_len = random_rows(rng, DOCS, seq_len, 40, cyclic=cyclic)
    pool = document_pool(DOCS)
    batch = jax.jit(
        lambda *a: pool_frames(
            *a, seq_len=seq_len, pad_token_id=P, eos_token_id=eos, segment_mode=segment_mode, cyclic=cyclic
        )
    )(pool, as32(doc), as32(t), as32(s), as32(copy_len))
    chex.assert_shape([batch.tokens, batch.loss_mask, batch.segment_ids], (40, seq_len))
    chex.assert_type([batch.tokens, batch.loss_mask, batch.segment_ids, batch.doc_idx], jnp.int32)
    for row in range(40):
        want = ref_frame(
            DOCS[doc[row]], t[row], s[row], copy_len[row], S=seq_len, eos=eos, cyclic=cyclic,
            isolate=segment_mode == "isolate",
        )  # fmt: skip
        got = (
            np.asarray(batch.tokens[row]),
            np.asarray(batch.loss_mask[row]),
            np.asarray(batch.segment_ids[row]),
        )
        chex.assert_trees_all_equal(got, want)
    assert np.asarray(batch.doc_idx).tolist() == doc.tolist()


def test_host_fetched_buffer_gives_the_same_frames_as_the_pool():
    # The pipeline path: each row's span fetched into a flat buffer at its own position.
    rng = np.random.default_rng(0)
    doc, t, s, copy_len = random_rows(rng, DOCS, 16, 32)
    pool = document_pool(DOCS)
    want = pool_frames(pool, as32(doc), as32(t), as32(s), as32(copy_len), seq_len=16, pad_token_id=P)
    spans = [DOCS[d][a : a + c] for d, a, c in zip(doc, t, copy_len, strict=True)]
    starts = np.concatenate([[0], np.cumsum([len(x) + 3 for x in spans])[:-1]])  # gaps between spans
    buffer = np.full(int(starts[-1]) + len(spans[-1]) + 3, 555)
    for start, span in zip(starts, spans, strict=True):
        buffer[start : start + len(span)] = span
    got = splice_frames(
        as32(buffer), as32(starts), as32(s), as32(copy_len), seq_len=16, pad_token_id=P, doc_idx=as32(doc)
    )
    chex.assert_trees_all_equal(got, want)
    for margin in (5, 16, 40):  # a pool padded once at construction builds the same frames
        padded = document_pool(DOCS, margin=margin)
        assert padded.tokens.shape[0] == pool.tokens.shape[0] + 2 * margin
        again = pool_frames(padded, as32(doc), as32(t), as32(s), as32(copy_len), seq_len=16, pad_token_id=P)
        chex.assert_trees_all_equal(again, want)


def test_cyclic_host_fetch_needs_no_wrap():
    doc = np.arange(7) + 40
    t, copy_len, length = as32([5, 0, 6]), as32([5, 7, 1]), as32([7, 7, 7])
    head, tail = (np.asarray(x).tolist() for x in cyclic_read_split(t, copy_len, length))
    assert (head, tail) == ([2, 7, 1], [3, 0, 0])
    spans = [np.concatenate([doc[a : a + h], doc[:r]]) for a, h, r in zip([5, 0, 6], head, tail, strict=True)]
    buffer = np.concatenate(spans)
    starts = np.concatenate([[0], np.cumsum([len(x) for x in spans])[:-1]])
    got = splice_frames(as32(buffer), as32(starts), as32([0, 1, 2]), copy_len, seq_len=8, pad_token_id=P)
    pool = document_pool([doc])
    want = pool_frames(
        pool, as32([0, 0, 0]), t, as32([0, 1, 2]), copy_len, seq_len=8, pad_token_id=P, cyclic=True
    )
    chex.assert_trees_all_equal(got.tokens, want.tokens)
    assert np.asarray(got.tokens)[0].tolist() == [45, 46, 40, 41, 42, P, P, P]


def test_no_recompile_across_steps():
    pool = document_pool(DOCS)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(pool, doc, t, s, copy_len):
        return pool_frames(pool, doc, t, s, copy_len, seq_len=12, pad_token_id=P)

    rng = np.random.default_rng(1)
    for _ in range(4):
        doc, t, s, copy_len = random_rows(rng, DOCS, 12, 9)
        step(pool, as32(doc), as32(t), as32(s), as32(copy_len))
    other_pool = document_pool([d + 1 for d in DOCS])  # same shapes, new tokens
    step(other_pool, as32(doc), as32(t), as32(s), as32(copy_len))


def test_levanter_lm_example_parity():
    """Our loss mask survives ``LmExample.causal``; the EOS variant derives the same segment ids."""
    hax = pytest.importorskip("haliax")
    from levanter.models.lm_model import LmExample

    pool = document_pool([np.arange(3, 12)])
    Pos = hax.Axis("position", 10)
    for t, s, copy_len in [(0, 0, 9), (2, 3, 7), (4, 6, 4), (1, 9, 1)]:
        batch = pool_frames(
            pool,
            as32([0]),
            as32([t]),
            as32([s]),
            as32([copy_len]),
            seq_len=10,
            pad_token_id=0,
            eos_token_id=2,
        )
        tokens = hax.named(batch.tokens[0], Pos)
        example = LmExample.causal(
            tokens,
            loss_mask=hax.named(batch.loss_mask[0], Pos),
            segment_ids=hax.named(batch.segment_ids[0], Pos),
        )
        assert np.asarray(example.loss_mask.array).tolist() == np.asarray(batch.loss_mask[0]).tolist()
        derived = np.asarray(LmExample.causal(tokens, eos_id=2).attn_mask.segment_ids[0].array)
        ours = np.asarray(batch.segment_ids[0])
        # Same attention partition (for s = 0 both are one segment: Levanter labels it 0, we label it 1).
        np.testing.assert_array_equal(
            np.equal.outer(derived, derived), np.equal.outer(ours, ours), err_msg=f"{t=} {s=}"
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(seq_len=0), "seq_len must be >= 1"),
        (dict(seq_len=4, segment_mode="both"), "segment_mode='both' is not one of"),
        (dict(seq_len=4, wrap_after=as32([1])), "wrap_after and wrap_by"),
    ],
)
def test_bad_static_arguments(kwargs, match):
    with unchecked(), pytest.raises(ValueError, match=match):  # the message a user sees
        splice_frames(as32([1, 2]), as32([0]), as32([0]), as32([2]), pad_token_id=0, **kwargs)


def test_shape_checks_refuse_a_segment_mode_outside_its_literal():
    with pytest.raises(jaxtyping.TypeCheckError, match="segment_mode"):
        splice_frames(
            as32([1, 2]), as32([0]), as32([0]), as32([2]), pad_token_id=0, seq_len=4, segment_mode="both"
        )


def test_pool_rejects_non_1d_documents():
    with pytest.raises(ValueError, match=r"docs\[1\] must be a 1-D integer array"):
        document_pool([np.arange(3), np.zeros((2, 2), dtype=np.int32)])
