"""Masked-LM masking on device: rates within binomial tolerance over 10^6 tokens, never a marker or
pad, static masks fixed per block, dynamic masks new per epoch, and per-row keys that make the mask
independent of how rows are sharded."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from meshbatch.datasets.preblocked import MLMMasking
from meshbatch.datasets.protocol import Plan, Rows
from meshbatch.kernels import Batch, block_batch

D, E, P, MASK, V = 257, 258, 259, 260, 257
ROWS, SEQ, CALLS = 256, 128, 32  # 32 calls of 256 rows: 1,048,576 tokens, one compiled shape


def rows_batch(seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, (ROWS, SEQ))
    specials = rng.random((ROWS, SEQ)) < 0.12
    tokens[specials] = rng.choice([D, E, P], int(specials.sum()))
    return block_batch(jnp.asarray(tokens, jnp.int32), doc_id=D, eod_id=E, pad_id=P)


def plan_for(n: int, epoch: int = 0, first: int = 0) -> Plan:
    position = jnp.arange(first, first + n, dtype=jnp.uint32)
    rows = Rows(position=position, epoch=jnp.full((n,), epoch, jnp.uint32))
    return Plan(rows=rows, source=jnp.zeros((n,), jnp.int32), example=(position * 7) % 100_003)


def stage(mode: str = "dynamic", **kw) -> MLMMasking:
    return MLMMasking(7, mask_id=MASK, vocab_size=V, special_ids=(D, E, P), mode=mode, **kw)


@jax.jit
def apply(stage_: MLMMasking, batch: Batch, plan: Plan) -> Batch:
    return stage_(batch, plan)


def within(count: int, trials: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - trials * p) <= sigmas * np.sqrt(trials * p * (1 - p))


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_rates_within_binomial_tolerance_never_structural(mode):
    got = {"eligible": 0, "selected": 0, "mask": 0, "other": 0, "pairs": 0, "both": 0}
    for call in range(CALLS):
        batch = rows_batch(call)
        masked = apply(stage(mode), batch, plan_for(ROWS, first=call * ROWS))
        tokens, labels, original = (np.asarray(x) for x in (masked.tokens, masked.labels, batch.tokens))
        eligible = ~np.isin(original, [D, E, P])
        selected = labels != -100
        assert not np.any(selected & ~eligible)  # never a marker or pad
        np.testing.assert_array_equal(tokens[~eligible], original[~eligible])
        np.testing.assert_array_equal(labels[selected], original[selected])
        np.testing.assert_array_equal(np.asarray(masked.loss_mask), selected.astype(np.int32))
        replaced = tokens[selected & (tokens != MASK)]
        assert replaced.min() >= 0 and replaced.max() < V  # random ids are ordinary ids
        got["eligible"] += int(eligible.sum())
        got["selected"] += int(selected.sum())
        got["mask"] += int(np.sum(selected & (tokens == MASK)))
        got["other"] += int(np.sum(selected & (tokens != MASK) & (tokens != original)))
        pairs = eligible[:, 1:] & eligible[:, :-1]  # neighbours drawn independently
        got["pairs"] += int(pairs.sum())
        got["both"] += int(np.sum(pairs & selected[:, 1:] & selected[:, :-1]))
    assert got["eligible"] > 900_000 and within(got["selected"], got["eligible"], 0.15)
    # 80 / 10 / 10: a random draw (uniform over the 257 ordinary ids) may hit the original token
    assert within(got["mask"], got["selected"], 0.8)
    assert within(got["other"], got["selected"], 0.1 * (1 - 1 / V))
    assert within(got["both"], got["pairs"], 0.15**2)


def test_static_fixed_per_block_dynamic_new_per_epoch():
    n = ROWS
    small = rows_batch(1)
    masks = {}
    for mode in ("static", "dynamic"):
        masks[mode] = [np.asarray(apply(stage(mode), small, plan_for(n, epoch=e)).labels) for e in (0, 1)]
    np.testing.assert_array_equal(masks["static"][0], masks["static"][1])
    assert np.mean(masks["dynamic"][0] != masks["dynamic"][1]) > 0.1
    # static: the same block at another place in the stream (another position) gets the same mask
    moved = plan_for(n, epoch=3, first=1000)
    moved = Plan(rows=moved.rows, source=moved.source, example=plan_for(n).example)
    np.testing.assert_array_equal(np.asarray(apply(stage("static"), small, moved).labels), masks["static"][0])


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_same_mask_whatever_the_sharding(mode):
    batch = rows_batch(2)
    plan = plan_for(ROWS, epoch=2, first=50)
    whole = apply(stage(mode), batch, plan)
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rows = PartitionSpec("data")
    sharded = jax.jit(
        jax.shard_map(lambda b, p: stage(mode)(b, p), mesh=mesh, in_specs=(rows, rows), out_specs=rows)
    )(batch, plan)
    for name in ("tokens", "labels", "loss_mask"):
        np.testing.assert_array_equal(np.asarray(getattr(sharded, name)), np.asarray(getattr(whole, name)))


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        (dict(rate=0.0), ValueError),
        (dict(rate=1.5), ValueError),
        (dict(mode="sometimes"), ValueError),
        (dict(mask_fraction=0.9, random_fraction=0.2), ValueError),
        (dict(ignore_id=5), ValueError),
        (dict(rate="0.1"), TypeError),
    ],
)
def test_stage_rejects(kw, error):
    with pytest.raises(error):
        stage(**kw)


@pytest.mark.parametrize(
    "mask_id, kw, message",
    [
        (D, {}, r"mask_id=257 is one of special_ids=\(257, 258, 259\) \(a structural or pad id\)"),
        (P, {}, r"mask_id=259 is one of special_ids"),
        (-1, {}, r"mask_id must be >= 0 \(got mask_id=-1\)"),
        (65, {}, r"mask_id=65 is an ordinary token of the vocabulary \[0, 257\)"),
        (MASK, {"mask_in_vocab": True}, r"mask_in_vocab=True but mask_id=260 is outside the vocabulary"),
        (65, {"mask_in_vocab": 1}, r"mask_in_vocab must be a bool"),
    ],
)
def test_mask_id_that_would_read_as_a_marker_pad_or_token_is_refused(mask_id, kw, message):
    with pytest.raises((ValueError, TypeError), match=message):
        MLMMasking(7, mask_id=mask_id, vocab_size=V, special_ids=(D, E, P), **kw)


def test_an_in_vocabulary_mask_token_is_never_drawn_nor_selected():
    inside = 65  # the tokenizer's own mask token (the documented exception)
    masking = MLMMasking(
        7,
        mask_id=inside,
        vocab_size=V,
        special_ids=(D, E, P),
        mask_in_vocab=True,
        rate=0.5,
        mask_fraction=0.5,
        random_fraction=0.5,
    )
    batch = rows_batch(3)
    original = np.asarray(batch.tokens)
    masked = apply(masking, batch, plan_for(ROWS))
    tokens, labels = np.asarray(masked.tokens), np.asarray(masked.labels)
    selected = labels != -100
    assert not np.any(selected & (original == inside))  # a literal mask token is never selected
    drawn = selected & (tokens != inside) & (tokens != original)
    assert drawn.sum() > 1000 and not np.any(np.isin(tokens[drawn], [inside, D, E, P]))
