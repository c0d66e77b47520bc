"""The packing plan kernel: golden plans, the plain-Python reference over awkward sizes, properties."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from preblock_reference import assemble, pack_ffd, pack_greedy

from meshbatch.datasets.preblocked import PackSpec, plan_layout
from meshbatch.kernels.preblocked.packing import pack_plan

D, E, P = -1, -2, -3  # marker and pad ids of the assembled blocks (documents hold ids >= 0)


def plan(lengths, n_pad: int = 1024, **kw):
    """The kernel on ``lengths`` padded to a fixed shape (one compilation for many cases)."""
    padded = np.zeros(max(n_pad, len(lengths)), np.int32)
    padded[: len(lengths)] = lengths
    got = pack_plan(jnp.asarray(padded), jnp.int32(len(lengths)), **kw)
    n = len(lengths)
    block, offset = np.asarray(got.block)[:n].tolist(), np.asarray(got.offset)[:n].tolist()
    return list(zip(block, offset, strict=True)), int(got.num_blocks)


def test_golden_module_example():
    # The trace in kernels/preblocked/packing.py's docstring; docs/preblocked.md repeats it.
    assert plan([1, 4, 2, 9], block_size=8, rule="greedy") == ([(0, 0), (1, 0), (2, 0), (2, 4)], 4)
    assert plan([1, 4, 2, 9], block_size=8, rule="ffd") == ([(3, 0), (2, 0), (1, 3), (0, 0)], 4)


SIZES = [1, 2, 3, 7, 8, 9, 16, 17, 31, 33, 61]  # n = 1, 2, 3, 2^k +- 1, primes


@pytest.mark.parametrize("block_size", [2, 3, 8, 16])
@pytest.mark.parametrize("buffer_docs", [4, 1024])  # 1024 > n: one buffer
def test_equals_reference(block_size, buffer_docs):
    rng = np.random.default_rng(block_size * 1000 + buffer_docs)
    for n in SIZES:
        lengths = rng.integers(0, 3 * block_size, n)
        kw = dict(block_size=block_size, buffer_docs=buffer_docs)
        assert plan(lengths, rule="greedy", **kw) == pack_greedy(lengths, block_size)
        assert plan(lengths, rule="ffd", **kw) == pack_ffd(lengths, block_size, buffer_docs)


@pytest.mark.parametrize("rule", ["greedy", "ffd"])
def test_blocks_hold_every_document_once_padding_at_tails(rule):
    rng = np.random.default_rng(5)
    S = 16
    for n in SIZES:
        lengths = rng.integers(0, 40, n)
        docs = [list(range(100 * d, 100 * d + int(k))) for d, k in enumerate(lengths)]
        placement, blocks = plan(lengths, block_size=S, rule=rule, buffer_docs=4)
        out = assemble(docs, placement, blocks, S, doc_id=D, eod_id=E, pad_id=P)
        stream = out.reshape(-1)
        # every document exactly once, whole, in order, between its markers (across blocks)
        for (block, offset), doc in zip(placement, docs, strict=True):
            at = block * S + offset
            assert stream[at : at + len(doc) + 2].tolist() == [D, *doc, E]
        assert np.count_nonzero(stream >= 0) == sum(len(d) for d in docs)
        # padding only at block tails, and no block is all padding
        is_pad = out == P
        assert not np.any(is_pad[:, :-1] & ~is_pad[:, 1:])
        assert not np.any(is_pad[:, 0])
        # a document that fits a block is never split
        for (_, offset), length in zip(placement, lengths, strict=True):
            if length + 2 <= S:
                assert offset + length + 2 <= S


def test_ffd_fills_better_than_greedy_on_short_documents():
    lengths = np.random.default_rng(0).integers(0, 100, 1000)
    fill = plan_layout(lengths, PackSpec(128, shuffle_level="none"), jax.random.key(0)).fill()
    assert fill["fill"] > 0.98 and fill["greedy_fill"] < 0.9  # grouping recovers greedy's padding


def test_no_recompile_across_corpora_and_block_sizes():
    from meshbatch.kernels.preblocked import packing

    before = packing._ffd._cache_size(), packing._greedy._cache_size()
    for seed, block_size in enumerate([8, 16, 128]):
        lengths = np.random.default_rng(seed).integers(0, 20, 37).astype(np.int32)
        for rule in ("ffd", "greedy"):
            pack_plan(
                jnp.asarray(lengths), jnp.int32(seed + 5), block_size=block_size, rule=rule, buffer_docs=5
            )
    after = packing._ffd._cache_size(), packing._greedy._cache_size()
    assert after[0] - before[0] <= 1 and after[1] - before[1] <= 1


def test_layout_shuffle_levels():
    lengths = np.random.default_rng(1).integers(0, 30, 200)
    key = jax.random.key(3)
    base = plan_layout(lengths, PackSpec(16, shuffle_level="none"), key)
    doc = plan_layout(lengths, PackSpec(16, shuffle_level="document"), key)
    seg = plan_layout(lengths, PackSpec(16, shuffle_level="segment"), key)
    np.testing.assert_array_equal(seg.starts, base.starts)  # segment: packed like none, then blocks move
    assert sorted(seg.block_order.tolist()) == list(range(seg.num_blocks))
    assert not np.array_equal(seg.block_order, np.arange(seg.num_blocks))
    np.testing.assert_array_equal(doc.block_order, np.arange(doc.num_blocks))
    assert not np.array_equal(doc.starts, base.starts)
    again = plan_layout(lengths, PackSpec(16, shuffle_level="document"), key)
    np.testing.assert_array_equal(again.starts, doc.starts)  # deterministic in the key
    # per-block real tokens agree with the assembled blocks
    docs = [[0] * int(k) for k in lengths]
    out = assemble(
        docs,
        [(int(s) // 16, int(s) % 16) for s in doc.starts],
        doc.num_blocks,
        16,
        doc_id=D,
        eod_id=E,
        pad_id=P,
    )
    np.testing.assert_array_equal(doc.real_tokens(), np.count_nonzero(out != P, axis=1))


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        (dict(block_size=1), ValueError),
        (dict(block_size=8.0), TypeError),
        (dict(block_size=8, shuffle_level="blocks"), ValueError),
        (dict(block_size=8, rule="best"), ValueError),
        (dict(block_size=8, buffer_docs=0), ValueError),
    ],
)
def test_pack_spec_rejects(kw, error):
    with pytest.raises(error):
        PackSpec(**kw)


def test_plan_layout_rejects_bad_lengths():
    spec, key = PackSpec(8), jax.random.key(0)
    with pytest.raises(ValueError, match="non-empty"):
        plan_layout(np.zeros(0, np.int64), spec, key)
    with pytest.raises(ValueError, match="negative length"):
        plan_layout(np.array([3, -1]), spec, key)
    with pytest.raises(ValueError, match="too long"):
        plan_layout(np.array([2**31 - 5]), spec, key)
