"""The fast path: Levanter's training loop fed global batches straight from ``meshbatch.Pipeline``.

Levanter's ``DataLoader`` asks a dataset for per-example ``LmExample``s, stacks them on the host
and places them on the mesh. ``PipelineLoader`` has the ``DataLoader``'s interface
(``iter_from_step``, ``__iter__``) and yields batched ``LmExample``s whose arrays are the
``Pipeline``'s globally sharded ones: plan, coalesced reads and build per shard on the devices,
no per-example objects, no host stacking. A ``MeshbatchDataset``'s row ``g`` is the pipeline's
stream position ``g``, so the batches equal the ``DataLoader``'s bit for bit (tested), the last
one of a finite stream (``epochs``) included: padded with zero rows, as the ``DataLoader`` pads it
(``pad_final_batch``, ``meshbatch.pipeline.final_batch``).

``fast_path()`` makes ``Trainer.data_loader`` return one for a ``MeshbatchDataset`` (the entry
point ``meshbatch.levanter.train_lm`` runs inside it); any other dataset gets Levanter's loader.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import haliax as hax
from levanter.layers.attention import AttentionMask
from levanter.models.lm_model import LmExample
from levanter.trainer import Trainer

from meshbatch.kernels import Batch
from meshbatch.pipeline.pipeline import Pipeline

from . import checkpoint_state
from .async_datasets import MeshbatchDataset


def batched_lm_example(batch: Batch, Batch_: hax.Axis, Pos: hax.Axis) -> LmExample:
    """A global ``Batch`` as one batched ``LmExample`` (what ``DataLoader`` stacks from examples)."""
    axes = (Batch_, Pos)
    return LmExample(
        tokens=hax.named(batch.tokens, axes),
        loss_mask=hax.named(batch.loss_mask, axes),
        attn_mask=AttentionMask.causal().with_segment_ids(hax.named(batch.segment_ids, axes)),
    )


class PipelineLoader:
    """``DataLoader``'s interface over a ``Pipeline`` of a ``MeshbatchDataset``'s dataset and key.

    Args:
        dataset: the ``MeshbatchDataset`` (its dataset, key, epochs and ``Pos``).
        mesh: the trainer's device mesh.
        axis_mapping: haliax's compute axis mapping; ``batch_axis`` names the mesh axes the batch
            is sharded over.
        batch_size: Levanter's ``train_batch_size`` (an int or its schedule).
        batch_axis: the batch axis name.
        checkpoint_path: where the trainer resumes from (``Trainer.checkpoint_path``): a stateful
            dataset's state is read back from there (``checkpoint_state``).
        pad_final_batch: with ``dataset.epochs`` set, yield the final partial batch, its rows past
            the end zeros (loss mask 0), as Levanter's ``DataLoader`` does by default (``True``);
            ``False`` drops it, as ``DataLoader(pad_final_batch=False)``.
    """

    def __init__(
        self,
        dataset: MeshbatchDataset,
        *,
        mesh,
        axis_mapping,
        batch_size,
        batch_axis: str = "batch",
        checkpoint_path: str | None = None,
        pad_final_batch: bool = True,
    ):
        data_axes = axis_mapping.get(batch_axis)
        if data_axes is None:
            raise ValueError(f"axis_mapping has no mesh axes for batch_axis={batch_axis!r}: {axis_mapping}")
        self.dataset, self.batch_axis, self.checkpoint_path = dataset, batch_axis, checkpoint_path
        self.pipeline = Pipeline(
            dataset.dataset,
            mesh=mesh,
            batch_size=batch_size,
            key=dataset.key,
            data_axes=data_axes,
            max_epochs=dataset.epochs,
            pad_final_batch=pad_final_batch,
        )

    def iter_from_step(self, step: int | None) -> Iterator[LmExample]:
        """Batches from ``step`` on; ``step`` may be the trainer state's step, a scalar array.
        O(1) resume: stateless datasets need nothing, a stateful one loads the state its
        checkpoint holds (else it replays its plans, and says so)."""
        start = 0 if step is None else int(step)
        checkpoint_state.restore(self.pipeline, start, self.checkpoint_path)
        metrics = getattr(self.dataset, "metrics", None)  # observe.StepMetrics, set by a data config
        with self.pipeline.iterate_from(start) as stream:  # closed when the trainer drops the loop
            for at, batch in enumerate(stream, start):
                Batch_ = hax.Axis(self.batch_axis, batch.tokens.shape[0])
                yield batched_lm_example(batch, Batch_, self.dataset.Pos)
                if metrics is not None:
                    metrics.after(at, self.pipeline)

    def __iter__(self) -> Iterator[LmExample]:
        return self.iter_from_step(0)


@contextlib.contextmanager
def fast_path():
    """Within it, ``Trainer.data_loader(dataset)`` of a ``MeshbatchDataset`` (``fast_path=True``, its
    default) is a ``PipelineLoader``; the training loader's (``batch`` not given, as ``train_lm``
    asks) state goes into each checkpoint (``checkpoint_state``)."""
    original = Trainer.data_loader

    def data_loader(self, dataset, batch=None):
        if not (isinstance(dataset, MeshbatchDataset) and dataset.fast_path):
            return original(self, dataset, batch)
        loader = PipelineLoader(
            dataset,
            mesh=self.device_mesh,
            axis_mapping=self.compute_axis_mapping,
            batch_size=batch.size if batch is not None else self.config.train_batch_size,
            batch_axis=batch.name if batch is not None else self.config.batch_axis,
            checkpoint_path=self.checkpoint_path,
        )
        if batch is None:
            checkpoint_state.track(loader.pipeline)
        return loader

    Trainer.data_loader = data_loader
    try:
        with checkpoint_state.saved_with_checkpoints():
            yield
    finally:
        Trainer.data_loader = original


__all__ = ["PipelineLoader", "batched_lm_example", "fast_path"]
