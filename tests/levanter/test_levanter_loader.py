"""Levanter compat mode yields the token batches Levanter's own DataLoader yields."""

import haliax as hax
import jax
import numpy as np
import pytest
from levanter.data.loader import DataLoader
from levanter.data.permutation import EraShufflingDataset, PermutationDataset
from levanter.data.text import TokenSeqDataset
from levanter.store.cache import SerialCacheWriter, TreeCache

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache

SEQ, BATCH, STEPS = 32, 16, 10
EXEMPLAR = {"input_ids": np.zeros(0, np.int32)}


@pytest.fixture(scope="module")
def levanter_cache(tmp_path_factory):
    """A cache written by Levanter's own SerialCacheWriter."""
    path = str(tmp_path_factory.mktemp("levanter") / "cache")
    rng = np.random.default_rng(1)
    docs = [rng.integers(2, 50_000, rng.integers(5, 400)).astype(np.int32) for _ in range(300)]
    with SerialCacheWriter(path, EXEMPLAR) as writer:
        writer.write_batch([{"input_ids": doc} for doc in docs])
    return path


def levanter_batches(path: str, strategy: str, key, mesh) -> list[np.ndarray]:
    dataset = TokenSeqDataset(TreeCache.load(path, EXEMPLAR), SEQ)
    if strategy == "full":
        dataset = PermutationDataset(dataset, key)
    else:
        dataset = EraShufflingDataset(dataset, 50, key=key)
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        loader = iter(DataLoader(dataset, BATCH, mesh=mesh, axis_resources={"batch": "data"}))
        return [np.asarray(next(loader)) for _ in range(STEPS)]


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("strategy", ["full", "era"])
def test_tokens_equal_levanter_dataloader(levanter_cache, strategy, devices):
    key = jax.random.PRNGKey(42)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
    spec = ShuffleSpec(strategy, compat="levanter", era_length=50 if strategy == "era" else None)
    dataset = CausalLMDataset(TokenCache.open(levanter_cache), SEQ, shuffle=spec)
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=key)
    theirs = levanter_batches(levanter_cache, strategy, key, mesh)
    for step, want in enumerate(theirs):
        np.testing.assert_array_equal(np.asarray(pipeline.batch(step).tokens), want, err_msg=f"{step=}")
