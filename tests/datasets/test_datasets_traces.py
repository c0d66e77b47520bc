"""Every worked trace of docs/datasets.md, step by step: plan, spans, fetch and build as printed,
the second pipeline that compiles nothing, and the shape of a checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiles import count_compiles
from meshes import mesh_of

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec, SpliceLMDataset, TokenBalancedMixture
from meshbatch.cache import CacheWriter, TokenCache
from meshbatch.datasets import Rows
from meshbatch.datasets.causal import CausalDevice, WindowBuild
from meshbatch.datasets.splice.splice_dataset import SplicePlan
from meshbatch.pipeline.fetch import fetch
from meshbatch.pipeline.row_layout import RowLayout


def plan_of(device, position, epoch=None):
    epoch = np.zeros_like(position) if epoch is None else epoch
    rows = Rows(jnp.asarray(position, jnp.uint32), jnp.asarray(epoch, jnp.uint32))
    plan, _ = device.plan(rows)
    return jax.tree.map(np.asarray, plan)


@pytest.fixture(scope="module")
def trace_caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    with CacheWriter(str(root / "causal")) as writer:
        writer.write([np.arange(10, 30), np.arange(30, 42)])  # tokens 10 .. 41, two documents
    with CacheWriter(str(root / "splice")) as writer:
        writer.write([np.full(5, 7), np.full(4, 8), np.array([50, 51, 52, 53])])  # doc 2 at tokens 9..12
    return str(root / "causal"), str(root / "splice")


def test_causal_trace(trace_caches):
    cache = TokenCache.open(trace_caches[0])
    dataset = CausalLMDataset(cache, 4, shuffle=ShuffleSpec("none"))
    plan = plan_of(dataset.make(jax.random.key(0))[0], np.arange(4, 8))
    assert plan.rows.position.tolist() == [4, 5, 6, 7] and plan.rows.epoch.tolist() == [0, 0, 0, 0]
    assert plan.source.tolist() == [0, 0, 0, 0] and plan.example.tolist() == [4, 5, 6, 7]
    layout = RowLayout.create(mesh_of(2), ("data",), 4)
    spans = dataset.spans(plan)
    assert spans.start.tolist() == [[16], [20], [24], [28]] and spans.length.tolist() == [[4]] * 4
    cache.counters.reset()
    tokens, offsets = fetch(dataset, spans, layout)
    assert cache.counters.reads_issued == 1  # one coalesced run for both device groups
    assert tokens[0].tolist() == [*range(26, 34)] and offsets[0].tolist() == [[0], [4]]
    assert tokens[1].tolist() == [*range(34, 42)] and offsets[1].tolist() == [[0], [4]]
    batch = Pipeline(dataset, mesh=mesh_of(2), batch_size=4, key=0).batch(1)
    assert np.asarray(batch.tokens)[:2].tolist() == [[26, 27, 28, 29], [30, 31, 32, 33]]
    assert np.asarray(batch.tokens)[2:].tolist() == [[34, 35, 36, 37], [38, 39, 40, 41]]
    assert np.asarray(batch.loss_mask)[0].tolist() == [1, 1, 1, 0]
    # "The buffer of a device always has rows_per_device * max_row_tokens slots (here 8)"
    assert layout.rows_per_device * dataset.max_row_tokens == 8 == len(tokens[0])


def test_splice_trace(trace_caches):
    cache = TokenCache.open(trace_caches[1])
    spec = dict(seq_len=6, content_length=3, content_start_mode="slide_within", pad_token_id=0)
    dataset = SpliceLMDataset.from_cache(cache, [2], pool=False, **spec)
    assert dataset.num_examples == 13  # t = 0, 1: s in 0..3; t = 2: s in 0..4
    plan = plan_of(dataset.make(jax.random.key(0))[0], np.array([4, 5]))
    assert isinstance(plan.detail, SplicePlan)
    assert {k: getattr(plan.detail, k).tolist() for k in ("doc", "t", "s", "copy_len")} == {
        "doc": [0, 0],
        "t": [1, 1],
        "s": [0, 1],
        "copy_len": [3, 3],
    }
    assert plan.example.tolist() == [4, 5] and dataset.content_margin == 6
    spans = dataset.spans(plan)
    assert spans.start.tolist() == [[10], [10]] and spans.length.tolist() == [[3], [3]]
    layout = RowLayout.create(mesh_of(1), ("data",), 2)
    cache.counters.reset()
    tokens, offsets = fetch(dataset, spans, layout)
    assert cache.counters.as_dict()["runs"] == 1 and cache.counters.unique_spans == 1
    assert tokens[0].tolist() == [0] * 6 + [51, 52, 53] + [0] * 9 + [0] * 6
    assert offsets[0].tolist() == [[6], [6]]
    batch = Pipeline(dataset, mesh=mesh_of(1), batch_size=2, key=0).batch(2)
    assert np.asarray(batch.tokens).tolist() == [[51, 52, 53, 0, 0, 0], [0, 51, 52, 53, 0, 0]]
    assert np.asarray(batch.loss_mask).tolist() == [[1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0]]
    assert np.asarray(batch.segment_ids).tolist() == [[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]]


def test_second_pipeline_trace(trace_caches):
    """docs/datasets.md, "a second pipeline compiles nothing": keys 3, 3, 4 over equal datasets."""

    def first_batch(key):
        dataset = CausalLMDataset(TokenCache.open(trace_caches[0]), 4, shuffle=ShuffleSpec())
        return dataset, np.asarray(Pipeline(dataset, mesh=mesh_of(1), batch_size=4, key=key).batch(0).tokens)

    dataset, first = first_batch(3)
    with count_compiles() as compiles:
        again, same = first_batch(3)
        _, other = first_batch(4)
    assert compiles == []
    np.testing.assert_array_equal(same, first)
    assert not np.array_equal(other, first)  # other rows
    one, two = dataset.make(jax.random.key(3))[0], again.make(jax.random.key(3))[0]
    assert one is not two and isinstance(one, CausalDevice)
    assert one.window == two.window == WindowBuild(seq_len=4, eos_id=None, ignore_id=None)
    assert one.builder() == one.window


def test_checkpoint_trace(trace_caches):
    """docs/datasets.md, "Carried state": {"version": 1, "step": k, "content": ..., **state}."""
    children = {"a": CausalLMDataset(TokenCache.open(trace_caches[0]), 4, shuffle=ShuffleSpec("none"))}
    dataset = TokenBalancedMixture(children)
    pipeline = Pipeline(dataset, mesh=mesh_of(1), batch_size=2, key=0)
    pipeline.batch(0)
    saved = pipeline.state_dict()
    state = dataset.state_dict(pipeline._planner.state(1))
    assert saved == {"version": 1, "step": 1, "content": pipeline.content_fingerprint(), **state}
    assert saved["datasets"] == [{"spec": "a", "row_offset": 2, "token_offset": 8}]
