"""The dataset protocol from outside: datasets defined only here run through ``Pipeline`` unchanged.

* ``TwoSourceToy``: every row reads a ragged span from each of two caches (two sources, two spans
  per row, ragged lengths), built by iota comparisons from the flat fetched buffer;
* ``CountingToy``: a stateful dataset whose plan depends on every earlier row (carried state,
  checkpointed with ``state_dict``);
* ``KeyedStage``: a build stage keyed per global row.

Each equals a numpy reference on 1x1, 1x8 and 2 processes x 4 devices, and never recompiles.
"""

import logging

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiles import count_compiles
from corpora import random_docs, write_docs
from meshes import mesh_of
from mp_harness import assemble, run_jobs

import meshbatch
from meshbatch import Batch, Pipeline
from meshbatch.cache import TokenCache
from meshbatch.datasets import Content, Dataset, DeviceDataset, Plan, Rows, Spans
from meshbatch.kernels import causal_lm_batch, gather_windows

SEQ = 16
BATCH = 8
STEPS = 5
LEAVES = ("tokens", "loss_mask", "segment_ids")


class HeadPlan(eqx.Module):
    """``TwoSourceToy``'s plan detail: tokens each row reads from source 0."""

    head: jax.Array


class TwoSourceDevice(DeviceDataset):
    """``TwoSourceToy``'s device half: a keyed permutation and ``seq_len``."""

    shuffle: eqx.Module
    seq_len: int = eqx.field(static=True)

    def plan(self, rows, state=None):
        example = self.shuffle(rows.position, epoch=rows.epoch)
        head = (1 + example % jnp.uint32(self.seq_len - 1)).astype(jnp.int32)
        source = (example % jnp.uint32(2)).astype(jnp.int32)
        return Plan(rows=rows, source=source, example=example, detail=HeadPlan(head)), None

    def build(self, plan, content: Content):
        position = jnp.arange(self.seq_len, dtype=jnp.int32)[None, :]
        head = plan.detail.head[:, None]
        index = jnp.where(
            position < head, content.offsets[:, :1] + position, content.offsets[:, 1:] + position - head
        )
        tokens = jnp.take(content.tokens, index)
        loss_mask = jnp.broadcast_to(position < self.seq_len - 1, tokens.shape).astype(jnp.int32)
        return Batch(tokens=tokens, loss_mask=loss_mask, segment_ids=(position >= head).astype(jnp.int32))


class TwoSourceToy(Dataset):
    """Row ``e``: tokens ``[e*S, e*S + head)`` of source 0, then ``[e*S + head, (e+1)*S)`` of source 1,
    ``head = 1 + e mod (S - 1)``; examples in a keyed permutation, reshuffled per epoch."""

    num_examples: int
    seq_len: int
    max_row_tokens: int
    spans_per_row: int = 2

    def __init__(self, first, second, seq_len: int, max_row_tokens: int | None = None):
        self.sources = (first, second)
        self.seq_len = seq_len
        self.max_row_tokens = seq_len if max_row_tokens is None else max_row_tokens
        self.num_examples = min(first.num_tokens, second.num_tokens) // seq_len

    def make(self, key):
        return TwoSourceDevice(meshbatch.permutation("feistel", self.num_examples, key), self.seq_len), self

    def spans(self, plan):
        first = plan.example.astype(np.int64) * self.seq_len
        head = plan.detail.head.astype(np.int64)
        starts = np.stack([first, first + head], axis=1)
        lengths = np.stack([head, self.seq_len - head], axis=1)
        return Spans(np.tile(np.array([0, 1], np.int32), (starts.shape[0], 1)), starts, lengths)


class CountingDevice(DeviceDataset):
    """``CountingToy``'s device half: no tables, only configuration."""

    num_examples: int = eqx.field(static=True)
    seq_len: int = eqx.field(static=True)

    def plan(self, rows, state=None):
        n = jnp.uint32(self.num_examples)
        offset = jnp.arange(rows.position.shape[0], dtype=jnp.uint32)
        example = (rows.position + state % n + offset) % n
        new_state = state + jnp.sum(example, dtype=jnp.uint32)
        return Plan(rows=rows, source=jnp.zeros(example.shape, jnp.int32), example=example), new_state

    def build(self, plan, content):
        return causal_lm_batch(gather_windows(content.tokens, content.offsets[:, 0], width=self.seq_len))


class CountingToy(Dataset):
    """Stateful: row ``i`` of a step reads window ``(position + state + i) mod n`` of a cache, and the
    state grows by the examples read, so each step depends on every earlier one."""

    num_examples: int
    seq_len: int
    max_row_tokens: int
    spans_per_row: int = 1

    def __init__(self, source, seq_len: int):
        self.sources = (source,)
        self.seq_len = self.max_row_tokens = seq_len
        self.num_examples = source.num_tokens // seq_len

    def make(self, key):
        return CountingDevice(self.num_examples, self.seq_len), self

    def init_state(self):
        return jnp.zeros((), jnp.uint32)

    def spans(self, plan):
        starts = plan.example.astype(np.int64)[:, None] * self.seq_len
        return Spans(np.zeros(starts.shape, np.int32), starts, np.full(starts.shape, self.seq_len, np.int64))

    def state_dict(self, state):
        return {"counter": int(state)}

    def load_state_dict(self, state_dict):
        return jnp.asarray(state_dict["counter"], jnp.uint32)


class KeyedStage(eqx.Module):
    """Adds a per-row keyed bit to the loss mask's first position: ``fold_in(key, position)`` then
    the epoch, so every cluster size draws the same bit for a row."""

    key: jax.Array

    def __call__(self, batch, plan):
        def bit(position, epoch):
            row_key = jax.random.fold_in(jax.random.fold_in(self.key, position), epoch)
            return jax.random.bits(row_key, dtype=jnp.uint32) & jnp.uint32(1)

        bits = jax.vmap(bit)(plan.rows.position, plan.rows.epoch).astype(jnp.int32)
        return Batch(
            tokens=batch.tokens,
            loss_mask=batch.loss_mask.at[:, 0].set(bits),
            segment_ids=batch.segment_ids,
        )


def write_cache(path, seed: int, docs: int = 40) -> str:
    return write_docs(path, random_docs(np.random.default_rng(seed), docs, (2, 30_000), (5, 60)))


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("protocol")
    return write_cache(root / "a", 0), write_cache(root / "b", 1)


def toy_pipeline(mesh, *, paths):
    first, second = (TokenCache.open(p) for p in paths)
    dataset = TwoSourceToy(first, second, SEQ)
    stage = KeyedStage(jax.random.key(11))
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=jax.random.key(3), stages=[stage])
    return pipeline, lambda: {"spans": first.counters.spans_requested + second.counters.spans_requested}


def counting_pipeline(mesh, *, paths, warmup: bool = True):
    cache = TokenCache.open(paths[0])
    pipeline = Pipeline(CountingToy(cache, SEQ), mesh=mesh, batch_size=BATCH, key=0, warmup=warmup)
    return pipeline, lambda: {"spans": cache.counters.spans_requested}


def flat(path) -> np.ndarray:
    cache = TokenCache.open(path)
    return np.concatenate(cache.read_rows(np.arange(cache.num_rows)))


def toy_reference(paths, step: int) -> dict[str, np.ndarray]:
    first, second = flat(paths[0]), flat(paths[1])
    n = min(first.size, second.size) // SEQ
    g = np.arange(step * BATCH, (step + 1) * BATCH)
    position, epoch = g % n, g // n
    shuffle = meshbatch.permutation("feistel", n, jax.random.key(3))
    example = np.asarray(shuffle(jnp.asarray(position, jnp.uint32), epoch=jnp.asarray(epoch, jnp.uint32)))
    tokens = np.empty((BATCH, SEQ), np.int32)
    segments = np.zeros((BATCH, SEQ), np.int32)
    for row, e in enumerate(example.tolist()):
        head = 1 + e % (SEQ - 1)
        tokens[row] = np.concatenate(
            [first[e * SEQ : e * SEQ + head], second[e * SEQ + head : (e + 1) * SEQ]]
        )
        segments[row, head:] = 1
    loss = np.ones((BATCH, SEQ), np.int32)
    loss[:, -1] = 0
    for row, (p, e) in enumerate(zip(position.tolist(), epoch.tolist(), strict=True)):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(11), p), e)
        loss[row, 0] = int(jax.random.bits(key, dtype=jnp.uint32)) & 1
    return {"tokens": tokens, "loss_mask": loss, "segment_ids": segments}


def counting_reference(path, steps: int) -> list[np.ndarray]:
    windows = flat(path)
    n = windows.size // SEQ
    windows = windows[: n * SEQ].reshape(n, SEQ)
    state, out = 0, []
    for step in range(steps):
        g = np.arange(step * BATCH, (step + 1) * BATCH)
        example = (g % n + state % n + np.arange(BATCH)) % n
        state = (state + int(example.sum())) % 2**32
        out.append(windows[example])
    return out


@pytest.mark.parametrize("devices", [1, 8])
def test_two_source_toy_equals_reference(caches, devices):
    pipeline, _ = toy_pipeline(mesh_of(devices), paths=caches)
    for step in range(STEPS):
        batch = pipeline.batch(step)
        want = toy_reference(caches, step)
        for name in LEAVES:
            np.testing.assert_array_equal(
                np.asarray(getattr(batch, name)), want[name], err_msg=f"{step=} {name}"
            )
        chex.assert_type([batch.tokens, batch.loss_mask, batch.segment_ids], jnp.int32)


def test_two_source_toy_never_recompiles(caches):
    pipeline, _ = toy_pipeline(mesh_of(8), paths=caches)
    jax.block_until_ready(pipeline.batch(0))
    with count_compiles() as compiles:
        for step in range(1, 2 * STEPS):  # ragged spans of new lengths every step, epoch boundaries too
            jax.block_until_ready(pipeline.batch(step))
    assert compiles == []


def test_toys_equal_across_two_processes(caches, tmp_path):
    """2 processes x 4 devices: the same batches, and each process reads only its own rows."""
    factories = ("toy_pipeline", "counting_pipeline")
    launched = run_jobs(  # both factories in one cluster launch
        tmp_path,
        processes=2,
        local_devices=4,
        mesh_shape="8",
        jobs=[(f"test_datasets_protocol:{f}", {"paths": list(caches)}, STEPS) for f in factories],
    )
    for factory, reference, results in zip(
        factories,
        (
            [toy_reference(caches, step) for step in range(STEPS)],
            [{"tokens": t} for t in counting_reference(caches[0], STEPS)],
        ),
        launched,
        strict=True,
    ):
        for step, want in enumerate(reference):
            for name, expected in want.items():
                got = assemble(results, step=step, leaf=name, like=expected)
                np.testing.assert_array_equal(got, expected, err_msg=f"{factory} {step=} {name}")
        spans_per_row = 2 if factory == "toy_pipeline" else 1
        for result in results:
            assert int(result["report/spans"]) == STEPS * BATCH // 2 * spans_per_row


def test_carried_state_equals_reference_and_resumes(caches):
    want = counting_reference(caches[0], 2 * STEPS)
    pipeline, _ = counting_pipeline(mesh_of(8), paths=caches)
    with pipeline.iterate_from(0) as stream:  # prefetch workers plan ahead, in step order
        got = [np.asarray(next(stream).tokens) for _ in range(STEPS)]
        saved = pipeline.state_dict()
    np.testing.assert_array_equal(np.stack(got), np.stack(want[:STEPS]))
    assert saved["step"] == STEPS and saved["version"] == 1 and "counter" in saved

    resumed, _ = counting_pipeline(mesh_of(1), paths=caches)
    with resumed.iterate_from(state=saved) as stream:
        after = [np.asarray(next(stream).tokens) for _ in range(STEPS)]
    np.testing.assert_array_equal(np.stack(after), np.stack(want[STEPS:]))
    assert resumed.state_dict()["step"] == 2 * STEPS

    fresh, _ = counting_pipeline(mesh_of(2), paths=caches)
    np.testing.assert_array_equal(np.asarray(fresh.batch(3).tokens), want[3])  # plans 0..3 in order
    np.testing.assert_array_equal(np.asarray(fresh.batch(1).tokens), want[1])  # replayed from step 0
    with pytest.raises(ValueError, match="the state at step 2 is not known"):
        resumed.batch(2)  # resumed at STEPS: nothing before its checkpoint is known


def test_a_replay_without_its_state_says_so_at_any_length(caches, caplog):
    """A stateful dataset asked for a step whose state it does not know (a resume without a
    state_dict) replays the plans since the latest state it knows, and says so in one WARNING
    line however short the replay; a stream from a known state (step 0, a state_dict, the next
    step) says nothing."""
    pipeline, _ = counting_pipeline(mesh_of(1), paths=caches)
    with caplog.at_level(logging.WARNING, logger="meshbatch.pipeline.state_planner"):
        pipeline.batch(0)
        pipeline.batch(1)  # the next step: its state is known
        saved = pipeline.state_dict()
        with pipeline.iterate_from(2) as stream:
            next(stream)
        resumed, _ = counting_pipeline(mesh_of(1), paths=caches)
        with resumed.iterate_from(state=saved) as stream:
            next(stream)
        assert not caplog.records
        replayed, _ = counting_pipeline(mesh_of(1), paths=caches, warmup=False)
        with replayed.iterate_from(2) as stream:  # two steps replayed: far fewer than 64
            np.testing.assert_array_equal(
                np.asarray(next(stream).tokens), counting_reference(caches[0], 3)[2]
            )
        (record,) = caplog.records
        assert record.levelno == logging.WARNING
        assert "planning steps 0..1 to rebuild the state of step 2" in record.getMessage()
        caplog.clear()
        replayed, _ = counting_pipeline(mesh_of(1), paths=caches, warmup=False)
        replayed.batch(1)  # one step
        (record,) = caplog.records
        assert "planning steps 0..0 to rebuild the state of step 1" in record.getMessage()


def test_stateless_checkpoint_is_the_step(caches):
    pipeline, _ = toy_pipeline(mesh_of(1), paths=caches)
    pipeline.batch(6)
    assert pipeline.state_dict() == {"version": 1, "step": 7, "content": pipeline.content_fingerprint()}
    with pytest.raises(ValueError, match=r"stateless; state has keys \['counter'\]"):
        pipeline.load_state_dict({"version": 1, "step": 0, "counter": 3})
    with pytest.raises(ValueError, match="state version=2"):
        pipeline.load_state_dict({"version": 2, "step": 0})


def test_a_checkpoint_of_other_data_resumes_with_a_warning_naming_both_fingerprints(caches, caplog):
    pipeline, _ = toy_pipeline(mesh_of(1), paths=caches)
    ours = pipeline.content_fingerprint()
    with caplog.at_level(logging.WARNING, logger="meshbatch.pipeline.pipeline"):
        pipeline.load_state_dict({"version": 1, "step": 3, "content": ours})
        pipeline.load_state_dict({"version": 1, "step": 3})  # written before fingerprints: silent
        assert not caplog.records
        pipeline.load_state_dict({"version": 1, "step": 4, "content": "0" * 32})
    (record,) = caplog.records
    assert f"fingerprint is {'0' * 32}, this pipeline's {ours}" in record.getMessage()
    assert pipeline.state_dict()["step"] == 4


def test_protocol_errors_name_the_dataset(caches):
    class WideToy(TwoSourceToy):
        """Declares one token fewer per row than its rows read."""

    first, second = (TokenCache.open(p) for p in caches)
    wide = WideToy(first, second, SEQ, max_row_tokens=SEQ - 1)
    with pytest.raises(
        ValueError, match=f"WideToy planned a row of {SEQ} tokens > its max_row_tokens={SEQ - 1}"
    ):
        Pipeline(wide, mesh=mesh_of(1), batch_size=BATCH, key=0).batch(0)
    with pytest.raises(TypeError, match="dataset must be a meshbatch Dataset"):
        Pipeline(object(), mesh=mesh_of(1), batch_size=BATCH, key=0)
    with pytest.raises(TypeError, match="key must be a JAX PRNG key or an int seed"):
        Pipeline(TwoSourceToy(first, second, SEQ), mesh=mesh_of(1), batch_size=BATCH, key=None)


def test_rows_of_a_plan_are_the_stream_coordinates(caches):
    first, second = (TokenCache.open(p) for p in caches)
    dataset = TwoSourceToy(first, second, SEQ)
    rows = Rows(jnp.arange(3, dtype=jnp.uint32), jnp.ones(3, jnp.uint32))
    plan, state = dataset.make(jax.random.key(0))[0].plan(rows)
    assert state is None and plan.rows is rows
    chex.assert_shape([plan.source, plan.example], (3,))
