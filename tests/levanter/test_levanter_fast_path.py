"""The fast path: ``PipelineLoader`` batches equal Levanter's ``DataLoader`` over the same
``MeshbatchDataset``, bit for bit and leaf for leaf, on 1 and 8 devices and across 2 processes x
4 devices; and it trains on a cache while the cache is still written (quick start)."""

import time

import haliax as hax
import jax
import numpy as np
import pytest
from corpora import random_docs, write_docs
from levanter.data.loader import DataLoader
from mp_harness import assemble, run_processes
from slow_writer import SEQ as QUICK_SEQ
from slow_writer import STEPS as QUICK_STEPS
from slow_writer import SlowWriter

from meshbatch import ShuffleSpec
from meshbatch.cache import TokenCache
from meshbatch.datasets import CausalLMDataset, SpliceLMDataset
from meshbatch.levanter import MeshbatchDataset, PipelineLoader

SEQ, BATCH, STEPS = 32, 8, 3
Pos = hax.Axis("position", SEQ)
QUICK_SPEC = ShuffleSpec("era", era_length=32)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    docs = random_docs(np.random.default_rng(0), 60, (2, 500), (20, 200), eos=1)
    return write_docs(tmp_path_factory.mktemp("fast") / "cache", docs)


def make_dataset(path: str, kind: str):
    cache = TokenCache.open(path)
    if kind == "causal":
        return CausalLMDataset(
            cache, SEQ, shuffle=ShuffleSpec("block", io_block_size=4, window_blocks=3), eos_id=1
        )
    spec = dict(seq_len=SEQ, content_length=20, content_start_mode="coverage_balanced", alpha=0.8)
    return SpliceLMDataset.from_cache(
        cache, np.arange(0, 60, 7), pool=False, shuffle_per_epoch=True, pad_token_id=0, **spec
    )


def leaves(example) -> dict[str, np.ndarray]:
    return {
        "tokens": np.asarray(example.tokens.array),
        "loss_mask": np.asarray(example.loss_mask.array),
        "segment_ids": np.asarray(example.attn_mask.segment_ids[0].array),
        "kv_segment_ids": np.asarray(example.attn_mask.segment_ids[1].array),
    }


def loader_reference(path: str, kind: str, devices: int) -> list[dict[str, np.ndarray]]:
    dataset = MeshbatchDataset(make_dataset(path, kind), Pos=Pos, key=jax.random.key(3), epochs=None)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
    loader = DataLoader(dataset, BATCH, mesh=mesh, axis_resources={"batch": "data"})
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        stream = loader.iter_from_step(0)
        try:
            return [leaves(next(stream)) for _ in range(STEPS)]
        finally:
            stream._batches.stop()  # the producer thread would otherwise outlive the test


def fast_pipeline(mesh, *, path: str, kind: str):
    """``PipelineLoader``'s pipeline for ``mp_worker`` (2 processes x 4 devices)."""
    dataset = MeshbatchDataset(make_dataset(path, kind), Pos=Pos, key=jax.random.key(3), epochs=None)
    loader = PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=BATCH)
    return loader.pipeline, dict


@pytest.mark.parametrize("kind", ["causal", "splice"])
@pytest.mark.parametrize("devices", [1, 8])
def test_fast_path_equals_dataloader(cache, kind, devices):
    want = loader_reference(cache, kind, devices)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
    dataset = MeshbatchDataset(make_dataset(cache, kind), Pos=Pos, key=jax.random.key(3), epochs=None)
    loader = PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=BATCH)
    for step, example in zip(range(STEPS), loader.iter_from_step(0), strict=False):
        got = leaves(example)
        assert example.tokens.axes == (hax.Axis("batch", BATCH), Pos)
        for name, array in want[step].items():
            assert got[name].dtype == array.dtype, (name, got[name].dtype, array.dtype)
            np.testing.assert_array_equal(got[name], array, err_msg=f"{kind} {devices=} {step=} {name}")
    resumed = leaves(next(loader.iter_from_step(2)))
    np.testing.assert_array_equal(resumed["tokens"], want[2]["tokens"])


def test_started_stream_is_the_one_iter_from_step_returns(cache):
    """``start(step)`` (the early start ``fast_path()`` gives ``train_lm``'s loader while the model
    initialises) makes the batches ``iter_from_step(step)`` then yields, the same as a loader never
    started; ``iter_from_step`` of another step closes it and starts its own."""
    want = loader_reference(cache, "causal", 1)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))

    def loader():
        dataset = MeshbatchDataset(make_dataset(cache, "causal"), Pos=Pos, key=jax.random.key(3), epochs=None)
        return PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=BATCH)

    early = loader()
    early.start(0)
    stream = early._started[1]
    got = [leaves(e) for _, e in zip(range(STEPS), early.iter_from_step(0), strict=False)]
    assert early._started is None and early.pipeline._stream() is stream  # the started one, not a new one
    for step in range(STEPS):
        np.testing.assert_array_equal(got[step]["tokens"], want[step]["tokens"])
    other = loader()
    other.start(0)
    started = other._started[1]
    np.testing.assert_array_equal(leaves(next(other.iter_from_step(2)))["tokens"], want[2]["tokens"])
    with pytest.raises(RuntimeError, match="closed"):
        next(started)


@pytest.mark.slow
def test_fast_path_equal_across_two_processes(cache, tmp_path):
    """The splice dataset's ragged fetched spans (the causal windows' Pipeline runs across 2 x 4
    in test_multiprocess; PipelineLoader wraps the same Pipeline)."""
    for kind in ("splice",):
        want = loader_reference(cache, kind, 1)
        out = tmp_path / kind
        out.mkdir()
        results = run_processes(
            out,
            processes=2,
            local_devices=4,
            mesh_shape="8",
            factory="test_levanter_fast_path:fast_pipeline",
            kwargs={"path": cache, "kind": kind},
            steps=STEPS,
        )
        for step in range(STEPS):
            for name in ("tokens", "loss_mask", "segment_ids"):
                got = assemble(results, step=step, leaf=name, like=want[step][name])
                np.testing.assert_array_equal(got, want[step][name], err_msg=f"{kind} {step=} {name}")


def test_quick_start_through_the_fast_path(tmp_path):
    """A cache still being written trains on the fast path: the first batch comes before the
    writer finishes, and the batches equal the finished cache's (era shuffle, same key)."""
    path = str(tmp_path / "cache")
    writer = SlowWriter(path)
    writer.start()
    assert writer.opened.wait(30) and writer.error is None
    Pos16 = hax.Axis("position", QUICK_SEQ)
    growing = CausalLMDataset(TokenCache.open(path, require_finished=False), QUICK_SEQ, shuffle=QUICK_SPEC)
    with pytest.raises(ValueError, match="still being written"):
        MeshbatchDataset(growing, Pos=Pos16, key=5, fast_path=False)
    dataset = MeshbatchDataset(growing, Pos=Pos16, key=5)
    with pytest.raises(ValueError, match="not by index"):
        dataset.batch([0])
    loader = PipelineLoader(dataset, mesh=one_device(), axis_mapping={"batch": "data"}, batch_size=BATCH)
    got, delivered = [], []
    for example in loader.iter_from_step(0):
        got.append(np.asarray(example.tokens.array))
        delivered.append(time.monotonic())
        writer.first_batch.set()
        if len(got) == QUICK_STEPS:
            break
    writer.join(60)
    assert writer.error is None and delivered[0] < writer.finished_at, "waited for the whole cache"
    finished = MeshbatchDataset(
        CausalLMDataset(TokenCache.open(path), QUICK_SEQ, shuffle=QUICK_SPEC), Pos=Pos16, key=5
    )
    for step, tokens in enumerate(got):
        want = np.asarray(finished.batch(np.arange(step * BATCH, (step + 1) * BATCH)).tokens)
        np.testing.assert_array_equal(tokens, want, err_msg=f"{step=}")


def one_device():
    return jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
