"""``epoch: N`` (a finite stream): the fast path yields the final partial batch padded as
Levanter's ``DataLoader`` pads it (``pad_final_batch=True``, its default), so every batch, the
padded last one included, equals the ``DataLoader``'s over Levanter's own dataset
(``EpochDataset(CausalLmDataset(TokenSeqDataset(...)))``, what Levanter's ``train_set`` makes),
leaf for leaf; the ``DataLoader`` over a ``MeshbatchDataset`` (the async path) too."""

import logging

import haliax as hax
import jax
import numpy as np
import pytest
from levanter.data.dataset import EpochDataset
from levanter.data.loader import DataLoader
from levanter.data.text import CausalLmDataset, TokenSeqDataset
from levanter.store.cache import SerialCacheWriter, TreeCache
from meshes import mesh_of

from meshbatch import ShuffleSpec
from meshbatch.cache import TokenCache
from meshbatch.datasets import CausalLMDataset, SpliceLMDataset
from meshbatch.levanter import MeshbatchDataset, PipelineLoader

SEQ, BATCH, EOS = 32, 8, 1
Pos = hax.Axis("position", SEQ)
EXEMPLAR = {"input_ids": np.zeros(0, np.int32)}


@pytest.fixture(scope="module")
def levanter_cache(tmp_path_factory):
    """30 documents, 106 windows of 32 tokens (the review's t6.py): 106 = 13 * 8 + 2."""
    path = str(tmp_path_factory.mktemp("final_batch") / "cache")
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(2, 500, rng.integers(20, 200)), EOS).astype(np.int32) for _ in range(30)]
    with SerialCacheWriter(path, EXEMPLAR) as writer:
        writer.write_batch([{"input_ids": doc} for doc in docs])
    return path


def meshbatch_dataset(path: str, epochs: int, fast_path: bool = True) -> MeshbatchDataset:
    dataset = CausalLMDataset(TokenCache.open(path), SEQ, shuffle=ShuffleSpec("none"), eos_id=EOS)
    return MeshbatchDataset(dataset, Pos=Pos, key=jax.random.key(3), epochs=epochs, fast_path=fast_path)


def dataloader_batches(dataset, mesh) -> list:
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        loader = DataLoader(dataset, BATCH, mesh=mesh, axis_resources={"batch": "data"})
        return list(loader.iter_from_step(0))  # finite: the producer ends by itself


def assert_same(got: list, want: list, what: str) -> None:
    assert len(got) == len(want), (what, len(got), len(want))
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert jax.tree.structure(a) == jax.tree.structure(b), (what, step)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            assert x.dtype == y.dtype and x.sharding == y.sharding, (what, step, x.dtype, y.dtype)
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f"{what} {step=}")


@pytest.mark.parametrize(("devices", "epochs"), [(1, 1), (8, 2)])
def test_fast_path_pads_the_final_batch_as_levanter(levanter_cache, devices, epochs):
    mesh = mesh_of(devices)
    n = 106 * epochs
    levanter = EpochDataset(
        CausalLmDataset(TokenSeqDataset(TreeCache.load(levanter_cache, EXEMPLAR), SEQ), Pos, eos_id=EOS),
        max_epochs=epochs,
    )
    want = dataloader_batches(levanter, mesh)
    assert len(want) == -(-n // BATCH)  # 14 (1 epoch), 27 (2 epochs): the last one partial
    real = n % BATCH  # rows of the last batch that hold examples: 2, 4
    np.testing.assert_array_equal(np.asarray(want[-1].loss_mask.array).sum(1)[real:], 0)
    assert np.asarray(want[-1].loss_mask.array).sum(1)[:real].min() > 0

    loader = PipelineLoader(
        meshbatch_dataset(levanter_cache, epochs), mesh=mesh, axis_mapping={"batch": "data"}, batch_size=BATCH
    )
    assert loader.pipeline.num_steps() == len(want)
    assert_same(list(loader.iter_from_step(0)), want, "fast path")
    assert_same(list(loader.iter_from_step(len(want) - 1)), want[-1:], "fast path resumed at the last step")

    # the async path: Levanter's DataLoader over a MeshbatchDataset pads by itself (its length is
    # epochs * num_examples)
    async_path = dataloader_batches(meshbatch_dataset(levanter_cache, epochs, fast_path=False), mesh)
    assert_same(async_path, want, "async path")


def test_fast_path_drops_the_final_batch_when_asked(levanter_cache, caplog):
    """``pad_final_batch=False`` (as ``DataLoader(pad_final_batch=False)``): 13 full batches; the
    end of the data says where training stops (issue 34: a run with ``epoch:`` stopped before
    ``num_train_steps`` without a word)."""
    loader = PipelineLoader(
        meshbatch_dataset(levanter_cache, 1),
        mesh=mesh_of(1),
        axis_mapping={"batch": "data"},
        batch_size=BATCH,
        pad_final_batch=False,
    )
    assert loader.pipeline.num_steps() == 13
    with caplog.at_level(logging.INFO, logger="meshbatch.levanter.fast"):
        assert sum(1 for _ in loader.iter_from_step(0)) == 13
    assert "the data ends after 1 epoch(s) (epoch: 1): step 12 was the last step with data" in caplog.text


def test_fast_path_pads_a_splice_dataset_as_the_dataloader(levanter_cache):
    """A splice dataset (rows carry ``doc_idx``, which ``LmExample`` drops): the padded last batch
    equals the ``DataLoader``'s over the same ``MeshbatchDataset``."""
    spec = dict(seq_len=SEQ, content_length=20, content_start_mode="coverage_balanced", alpha=0.8)
    splice = SpliceLMDataset.from_cache(
        TokenCache.open(levanter_cache), np.array([5, 20]), pool=False, pad_token_id=0, **spec
    )
    assert splice.num_examples % BATCH == 5  # 173 rows: 22 batches, the last holding 5
    mesh = mesh_of(8)
    dataset = MeshbatchDataset(splice, Pos=Pos, key=jax.random.key(3), epochs=1, fast_path=False)
    want = dataloader_batches(dataset, mesh)
    assert len(want) == -(-splice.num_examples // BATCH)
    loader = PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=BATCH)
    assert_same(list(loader.iter_from_step(0)), want, "splice fast path")
