"""Per-frame loss of a splice run's checkpoint on frames it trained on and on the same text at
placements it never saw (run by test_train_lm in a clean process; prints one JSON line).

    python frame_losses.py CONFIG.yaml CHECKPOINT_DIR STEPS

Seen: the frames of training steps ``0 .. STEPS - 1``, rebuilt from ``train_lm``'s data key.
Unseen: each seen frame's text (``doc``, ``t``, ``copy_len``) at the latest offset ``s' > s``
with ``s' = 2 (mod 4)``: the example config places text on a stride of 4, so never there.
"""

import dataclasses
import json
import sys

import draccus
import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
from levanter.checkpoint import load_checkpoint
from levanter.layers.attention import AttentionMask
from levanter.models.lm_model import LmExample, compute_next_token_loss

from meshbatch.datasets import Rows
from meshbatch.datasets.splice.indexed import SpliceDataset
from meshbatch.levanter import MeshbatchDataset
from meshbatch.levanter.train_lm import TrainLmConfig


def main(config_path: str, checkpoint: str, steps: int) -> dict:
    config = draccus.parse(TrainLmConfig, config_path=config_path, args=[])
    seq_len, batch = config.model.seq_len, config.trainer.train_batch_size
    Pos = hax.Axis("position", seq_len)
    data_key = jax.random.split(jax.random.PRNGKey(config.trainer.seed), 4)[0]  # as train_lm
    dataset = MeshbatchDataset(config.data.dataset(seq_len), Pos=Pos, key=data_key)
    rows = np.arange(steps * batch)
    seen = dataset.batch(rows)
    epoch, position = np.divmod(rows, dataset.num_examples)
    plan, _ = dataset.device.plan(Rows(jnp.asarray(position, jnp.uint32), jnp.asarray(epoch, jnp.uint32)))
    doc, t, s, copy_len = (np.asarray(getattr(plan.detail, name)) for name in ("doc", "t", "s", "copy_len"))
    late = seq_len - copy_len
    late -= (late - 2) % 4
    later = np.flatnonzero(late > s)
    cache = config.data.cache()
    docs = cache.read_rows(config.data.selected(cache, seq_len).indices)
    placed = SpliceDataset(docs, key=jax.random.key(0), **dataclasses.asdict(config.data.spec(seq_len)))
    unseen = placed.frames_at(doc[later], t[later], late[later])

    Vocab = hax.Axis("vocab", len(config.data.the_tokenizer))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("replica", "data", "model"))
    with hax.partitioning.set_mesh(mesh):
        model = eqx.filter_eval_shape(config.model.build, Vocab, key=jax.random.PRNGKey(0))
        model = load_checkpoint(
            model, checkpoint, subpath="model", discover_latest=False, mesh=mesh, axis_mapping={}
        )

    def losses(frames, index):
        tokens, mask, segments = (
            np.asarray(x)[index] for x in (frames.tokens, frames.loss_mask, frames.segment_ids)
        )
        axes = (hax.Axis("batch", tokens.shape[0]), Pos)
        example = LmExample(
            tokens=hax.named(jnp.asarray(tokens), axes),
            loss_mask=hax.named(jnp.asarray(mask), axes),
            attn_mask=AttentionMask.causal().with_segment_ids(hax.named(jnp.asarray(segments), axes)),
        )
        loss = np.asarray(compute_next_token_loss(model, example, reduction=None).array, np.float64)
        return (loss * mask).sum(1) / np.maximum(mask.sum(1), 1)

    a, b = losses(seen, later), losses(unseen, np.arange(later.size))
    return {
        "frames": int(later.size),
        "seen": float(a.mean()),
        "unseen": float(b.mean()),
        "max_gap": float(np.abs(a - b).max()),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
