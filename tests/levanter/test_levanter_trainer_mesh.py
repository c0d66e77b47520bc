"""Levanter datasets built inside a Trainer (as train_lm builds config.data.train_set) and read by
the trainer's DataLoader, which reads inside levanter's local_cpu_mesh()."""

import asyncio

import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from levanter.checkpoint import CheckpointerConfig
from levanter.data.dataset import ListAsyncDataset
from levanter.distributed import RayConfig
from levanter.tracker import NoopConfig
from levanter.trainer import Trainer, TrainerConfig

from meshbatch.levanter import BlockShufflingDataset, MultiSpliceDocumentDataset

SEQ, BATCH, STEPS = 32, 8, 3
Pos = hax.Axis("position", SEQ)
RNG = np.random.default_rng(0)
DOCS = [RNG.integers(1, 256, int(n)).astype(np.int32) for n in RNG.integers(20, 200, 12)]
ROWS = [hax.named(jnp.asarray(RNG.integers(0, 256, SEQ), jnp.int32), Pos) for _ in range(100)]


def tokens(x) -> np.ndarray:
    return np.asarray((x.tokens if hasattr(x, "tokens") else x).array)


def splice(key):
    return MultiSpliceDocumentDataset(
        Pos=Pos, doc_tokens_list=DOCS, pad_token_id=0, eos_token_id=256,
        content_start_mode="coverage_balanced", alpha=0.8, shuffle_per_epoch=True, key=key,
    )  # fmt: skip


def block(key):
    return BlockShufflingDataset(ListAsyncDataset(ROWS, is_complete=True), 4, window_blocks=3, key=key)


@pytest.mark.parametrize("make", [splice, block])
@pytest.mark.parametrize("typed_key", [False, True])
def test_built_under_trainer_mesh_read_by_dataloader(tmp_path, make, typed_key):
    config = TrainerConfig(
        require_accelerator=False, tracker=NoopConfig(), ray=RayConfig(auto_start_cluster=False),
        train_batch_size=BATCH, num_train_steps=STEPS, id="mesh", log_dir=tmp_path / "logs",
        checkpointer=CheckpointerConfig(base_path=str(tmp_path / "ckpt")),
    )  # fmt: skip
    root = jax.random.key(0) if typed_key else jax.random.PRNGKey(0)
    want_ds = make(jax.random.split(root, 4)[0])  # outside any mesh
    want = [
        np.stack([tokens(ex) for ex in asyncio.run(want_ds.get_batch(range(s * BATCH, (s + 1) * BATCH)))])
        for s in range(STEPS)
    ]
    with Trainer(config, optax.sgd(1e-3), lambda *a, **k: 0.0) as trainer:
        assert trainer.device_mesh.devices.size == jax.device_count()
        dataset = make(jax.random.split(root, 4)[0])  # as train_lm.py: the data key made under the mesh
        loader = trainer.data_loader(dataset).iter_from_step(0)
        try:
            for step in range(STEPS):
                np.testing.assert_array_equal(tokens(next(loader)), want[step], err_msg=f"{step=}")
        finally:
            # The producer thread holds the iterator, so __del__ never stops it; one still inside
            # jax when the interpreter exits aborts the process ("FATAL: exception not rethrown").
            loader._batches.stop()
