"""BlockDataset through the Pipeline: a store and the same documents packed on the fly give the same
batches and masks; masks (static and dynamic) are the same on 1 device, 8 devices and 2 processes
x 4 devices (jax.distributed + gloo)."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from compiles import count_compiles
from corpora import topic_texts, write_jsonl
from meshes import mesh_of
from mp_harness import assemble, run_processes

from meshbatch import Pipeline, ShuffleSpec
from meshbatch.datasets.preblocked import PackSpec, preblock
from meshbatch.datasets.preblocked.block_dataset import BlockDataset, CacheBlockDataset

BLOCK, BATCH, STEPS = 64, 32, 3  # ~100 blocks: the six steps of `masked_steps` cross epochs
LEAVES = ("tokens", "loss_mask", "segment_ids", "labels")
# Block order is ShuffleSpec's business (tested with it); "none" spares each pipeline a permutation
# compile, and the stream still crosses epochs, where static and dynamic masks part ways.
SHUFFLE = ShuffleSpec("none")
IDS = dict(doc_id=257, eod_id=258, pad_id=259, vocab_size=257)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    text = write_jsonl(root / "docs.jsonl", topic_texts(8, paragraphs=10))
    path = str(root / "store")
    # written with the packing key of the pipelines' key (7): legacy mode packs the same blocks
    preblock(path, [str(text)], block_size=BLOCK, key=BlockDataset.pack_key(7), progress=False)
    return path


class MaskedSteps:
    """Steps ``0 .. STEPS - 1`` with static masks, then ``STEPS .. 2 * STEPS - 1`` with dynamic
    ones: one object for ``mp_worker`` (which only calls ``batch(step)``)."""

    def __init__(self, mesh, path: str, legacy: bool = False):
        if legacy:
            dataset = CacheBlockDataset(
                os.path.join(path, "tokens"), shuffle=SHUFFLE, pack=PackSpec(BLOCK), **IDS
            )
        else:
            dataset = BlockDataset(path, shuffle=SHUFFLE)
        self.dataset = dataset
        self.pipelines = [
            Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=7, stages=[dataset.masking(3, mode=mode)])
            for mode in ("static", "dynamic")
        ]

    def batch(self, step: int):
        return self.pipelines[min(step // STEPS, 1)].batch(step)


def masked_steps(mesh, *, path: str, legacy: bool = False):
    return MaskedSteps(mesh, path, legacy), dict


def collect(steps: MaskedSteps) -> list[dict[str, np.ndarray]]:
    return [{leaf: np.asarray(getattr(steps.batch(s), leaf)) for leaf in LEAVES} for s in range(2 * STEPS)]


@pytest.fixture(scope="module")
def one_device(store):
    return MaskedSteps(mesh_of(1), store)


@pytest.fixture(scope="module")
def reference(one_device):
    return collect(one_device)


def test_store_and_on_the_fly_packing_give_the_same_masked_batches(store, reference):
    assert BlockDataset(store).num_examples < 2 * STEPS * BATCH  # epochs are crossed
    legacy = collect(MaskedSteps(mesh_of(1), store, legacy=True))
    for step, (got, want) in enumerate(zip(legacy, reference, strict=True)):
        for leaf in LEAVES:
            np.testing.assert_array_equal(got[leaf], want[leaf], err_msg=f"{step=} {leaf}")
    for step in range(2 * STEPS):
        labels, tokens = reference[step]["labels"], reference[step]["tokens"]
        assert np.all(labels[np.isin(tokens, [257, 258, 259])] == -100)  # never a marker or pad
        assert np.any(labels != -100)


def test_static_masks_repeat_per_block_dynamic_ones_do_not(one_device):
    steps = one_device
    dataset, n = steps.dataset, steps.dataset.num_examples
    shuffle = dataset.make(jax.random.key(7))[0].shuffle
    per_block = {"static": {}, "dynamic": {}}
    for index, pipeline in enumerate(steps.pipelines):
        mode = ("static", "dynamic")[index]
        for step in range(2 * STEPS):  # more rows than blocks: blocks seen in two epochs
            rows = np.arange(step * BATCH, (step + 1) * BATCH)
            example = np.asarray(dataset.shuffle_spec.apply(shuffle, rows % n, rows // n))
            labels = np.asarray(pipeline.batch(step).labels)
            for block, row in zip(example.tolist(), labels, strict=True):
                per_block[mode].setdefault(block, []).append(row)
    repeated = [rows for rows in per_block["static"].values() if len(rows) > 1]
    assert repeated and all(np.array_equal(rows[0], r) for rows in repeated for r in rows[1:])
    again = [rows for rows in per_block["dynamic"].values() if len(rows) > 1]
    assert again and not all(np.array_equal(rows[0], rows[1]) for rows in again)


def test_eight_devices_give_the_same_batches_and_never_recompile(store, reference):
    steps = MaskedSteps(mesh_of(8), store)
    steps.batch(0), steps.batch(STEPS)
    with count_compiles() as compiles:
        got = collect(steps)
    assert compiles == []
    for step, (g, want) in enumerate(zip(got, reference, strict=True)):
        for leaf in LEAVES:
            np.testing.assert_array_equal(g[leaf], want[leaf], err_msg=f"{step=} {leaf}")


def test_two_processes_of_four_devices_give_the_same_batches(store, reference, tmp_path):
    results = run_processes(
        tmp_path,
        processes=2,
        local_devices=4,
        mesh_shape="8",
        factory="test_preblock_pipeline:masked_steps",
        kwargs={"path": store},
        steps=2 * STEPS,
    )
    for step, want in enumerate(reference):
        for leaf in LEAVES:
            got = assemble(results, step=step, leaf=leaf, like=want[leaf])
            np.testing.assert_array_equal(got, want[leaf], err_msg=f"{step=} {leaf}")
