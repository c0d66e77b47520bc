"""``max_epochs`` ending inside a step: dropped by default, padded with zero rows on request
(``pad_final_batch=True``, Levanter's ``DataLoader`` padding), same shapes, nothing recompiles."""

import jax
import numpy as np
import pytest
from compiles import count_compiles
from meshes import mesh_of
from mp_harness import assemble, run_processes
from test_pipeline import SEQ, expected_stream

from meshbatch import BatchSchedule, CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache

SPEC = ShuffleSpec("full")
SCHEDULE = BatchSchedule([(0, 8), (3, 16)])


def pipelines(path: str) -> tuple[Pipeline, Pipeline, int]:
    """The same 2-epoch stream dropped and padded, on a (data 4, model 2) mesh: every row range
    held by two devices; and the stream's length."""
    dataset = CausalLMDataset(TokenCache.open(path), SEQ, shuffle=SPEC, eos_id=1)
    common = dict(mesh=mesh_of((4, 2), ("data", "model")), batch_size=SCHEDULE, key=7, max_epochs=2)
    drop = Pipeline(dataset, **common)
    return drop, Pipeline(dataset, **common, pad_final_batch=True), 2 * dataset.num_examples


def test_steps_within_counts_like_levanter():
    schedule = BatchSchedule(8)
    assert [schedule.steps_within(total, pad) for total in (104, 105, 106) for pad in (False, True)] == [
        13, 13, 13, 14, 13, 14,
    ]  # fmt: skip
    assert SCHEDULE.steps_within(3 * 8 + 16 + 1, True) == 5 and SCHEDULE.steps_within(3 * 8 + 16, True) == 4


def test_the_final_partial_step_is_dropped_or_padded(cache_path):
    drop, pad, total = pipelines(cache_path)
    whole = drop.num_steps()
    assert whole == SCHEDULE.steps_within(total) and SCHEDULE.offset(whole) < total, "no partial step"
    assert pad.num_steps() == whole + 1
    last = whole
    real = total - SCHEDULE.offset(last)
    assert 0 < real < 16 and real % 4 != 0, f"{real=}: pick data so a shard holds both kinds of rows"

    for step in (0, whole - 1):  # compile both batch sizes; the steps before the last agree
        a, b = drop.batch(step), pad.batch(step)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(IndexError, match=f"step={last} is past the end"):
        drop.batch(last)

    with count_compiles() as compiles:
        batch = jax.block_until_ready(pad.batch(last))
    assert compiles == []
    assert batch.tokens.shape == (16, SEQ) and batch.tokens.sharding == drop.batch(whole - 1).tokens.sharding
    np.testing.assert_array_equal(
        np.asarray(batch.tokens)[:real], expected_stream(cache_path, SPEC, 7, SCHEDULE.offset(last), real)
    )
    assert np.asarray(batch.loss_mask)[:real].sum(1).min() > 0
    for name in ("tokens", "loss_mask", "segment_ids"):
        leaf = getattr(batch, name)
        np.testing.assert_array_equal(np.asarray(leaf)[real:], 0, err_msg=name)
        for shard in leaf.addressable_shards:  # every replica holds the padded rows
            rows = np.arange(16)[shard.index[0]]
            np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(leaf)[rows], err_msg=name)
    with pytest.raises(IndexError, match=f"step={last + 1} is past the end"):
        pad.batch(last + 1)

    with pad.iterate_from(last - 1) as stream:  # the stream ends after the padded step
        got = [np.asarray(b.tokens) for b in stream]
    assert len(got) == 2
    np.testing.assert_array_equal(got[1], np.asarray(batch.tokens))
    # the padded step's zero rows are no examples
    assert pad.stats()["examples_made"] == SCHEDULE.batch_size(last - 1) + real


def test_pad_final_batch_is_a_bool(cache_path):
    dataset = CausalLMDataset(TokenCache.open(cache_path), SEQ)
    with pytest.raises(TypeError, match=r"pad_final_batch must be a bool \(got pad_final_batch='yes'\)"):
        Pipeline(dataset, mesh=mesh_of((1,), ("data",)), batch_size=8, key=0, pad_final_batch="yes")


class LastSteps:
    """The last ``count`` steps of a pipeline as steps ``0 .. count - 1`` (for ``mp_worker``,
    which makes steps from 0)."""

    def __init__(self, pipeline: Pipeline, count: int):
        self.pipeline, self.first = pipeline, pipeline.num_steps() - count

    def batch(self, step: int):
        return self.pipeline.batch(self.first + step)


def padded_tail(mesh, *, cache_path: str):
    """A ``mp_worker`` factory: the padded pipeline's last 2 steps on a multi-process mesh."""
    dataset = CausalLMDataset(TokenCache.open(cache_path), SEQ, shuffle=SPEC, eos_id=1)
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=SCHEDULE, key=7, max_epochs=2, pad_final_batch=True)
    return LastSteps(pipeline, 2), dict


def test_padded_final_step_across_processes(cache_path, tmp_path):
    """2 processes x 4 devices, (data 4, model 2): each process zeroes its own shards; the
    stitched batches are the single-process ones."""
    _, pad, _ = pipelines(cache_path)
    want = [pad.batch(pad.num_steps() - 2 + step) for step in range(2)]
    results = run_processes(
        tmp_path,
        processes=2,
        local_devices=4,
        mesh_shape="4x2",
        factory="test_pipeline_final_batch:padded_tail",
        kwargs={"cache_path": cache_path},
        steps=2,
    )
    for step in range(2):
        for name in ("tokens", "loss_mask", "segment_ids"):
            expected = np.asarray(getattr(want[step], name))
            got = assemble(results, step=step, leaf=name, like=expected)
            np.testing.assert_array_equal(got, expected, err_msg=f"{step=} {name=}")
    assert (np.asarray(want[1].loss_mask).sum(1) == 0).any(), "the last step is not padded"
