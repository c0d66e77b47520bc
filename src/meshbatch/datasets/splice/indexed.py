"""In-memory splice datasets: a thin front over ``SpliceLMDataset`` for index-based access.

``SpliceDataset(docs, key=..., **spec).get_batch(indices)`` builds the frames of global example
indices (``epoch = index // len``) with the pipeline's own plan and build kernels, in one jitted
call; ``splice_batch`` is the one-shot form. The pipeline is the way to stream batches; this is
for inspection, tests and callers with their own loop (``shard_indices`` gives such a loop the
seed's leapfrog split of indices over processes).

    docs = [[0, 1, 2, 3, 4]], seq_len = 5, content_length = 3, content_start_mode = "slide_within"
    len(SpliceDataset(docs, ...)) = 13      # (t, s) = (0,0) (0,1) (0,2) (1,0) ... (3,2) (3,3)
    splice_batch(docs, [9], pad_token_id=P, ...).tokens == [[3, 4, P, P, P]]
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from meshbatch.arguments import check_int, check_int_array
from meshbatch.datasets.protocol import Rows
from meshbatch.kernels import Batch, pool_frames

from .splice_dataset import SpliceDevice, SpliceLMDataset
from .splice_schedule import schedule_key, validation_rows


def split_indices(indices, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Global example indices -> ``(epoch, row)`` (int64), checking type and range.

    Raises:
        TypeError: indices that are not integers.
        ValueError: an empty or non-1-D array, a negative index, or one past epoch ``2^32 - 1``.
    """
    if isinstance(indices, str | bytes):
        raise TypeError(f"indices must be integers (got indices={indices!r})")
    idx = np.asarray(indices)
    if idx.ndim != 1 or idx.size == 0:
        raise ValueError(
            f"indices must be a non-empty 1-D integer array (got shape={idx.shape}, {idx.dtype})"
        )
    if not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"indices must be integers (got dtype={idx.dtype})")
    if idx.min() < 0:
        raise ValueError(f"indices must be >= 0 (got {int(idx.min())})")
    if idx.dtype == np.uint64 and idx.max() >= 2**63:
        raise ValueError(f"index {int(idx.max())} lies past epoch 2^32 - 1")
    epoch, row = np.divmod(idx.astype(np.int64), num_rows)
    if epoch.max() >= 2**32:
        raise ValueError(f"index {int(idx.max())} lies past epoch 2^32 - 1")
    return epoch, row


def shard_indices(local_indices, *, process_index: int, process_count: int) -> np.ndarray:
    """This process's global example indices: ``local * process_count + process_index``.

    The seed's leapfrog sharding, for a caller that feeds ``get_batch`` from its own per-process
    loop: process ``p`` of ``P`` owns every index ``n`` with ``n % P == p``, so processes never
    duplicate a pair and together cover every one. ``Pipeline`` does not need it: it splits each
    global batch by the mesh's row layout, the same for any number of processes.
    """
    process_count = check_int("process_count", process_count, low=1, high=2**31 - 1)
    process_index = check_int("process_index", process_index, low=0)
    if process_index >= process_count:
        raise ValueError(f"process_index={process_index} must be < process_count={process_count}")
    local = check_int_array("local_indices", local_indices)
    if local.size and (local.min() < 0 or int(local.max()) > (2**63 - 1 - process_index) // process_count):
        raise ValueError(
            f"local_indices must be >= 0 and keep global indices below 2^63 (got {local_indices!r})"
        )
    return local.astype(np.int64) * process_count + process_index


def frames_of(device: SpliceDevice, rows: Rows) -> Batch:
    """Plan and build of pool rows (what ``_frames`` compiles)."""
    plan, _ = device.plan(rows)
    return device.build(plan, None)


@eqx.filter_jit
def _frames(device: SpliceDevice, rows: Rows) -> Batch:
    """``frames_of`` in one program, module-level: equal datasets share it whatever their key."""
    return frames_of(device, rows)


class SpliceDataset:
    """In-memory documents as a splice dataset: ``get_batch`` by global example index.

    Args:
        docs: 1-D integer token arrays.
        key: the key of the spec's shuffles and uniform jitter (required when the spec uses one).
        **spec: ``SpliceSpec`` fields; ``pad_token_id`` is required.

    Attributes:
        dataset: the ``SpliceLMDataset`` it fronts; ``device``: its device half for ``key``
            (its plan and build make every frame).
        schedule: the splice schedule; ``pool``: the device-resident documents.
        frame_args: the static arguments of ``pool_frames`` (``cyclic`` included).
    """

    def __init__(self, docs: Sequence[np.ndarray], *, key=None, **spec):
        self.dataset = SpliceLMDataset(docs, **spec)
        self.spec = self.dataset.spec
        self.device, _ = self.dataset.make(schedule_key(self.spec, key))
        self.schedule, self.pool = self.device.schedule, self.device.pool
        self.frame_args = dict(self.dataset.frame_args, cyclic=self.dataset.cyclic)

    def __len__(self) -> int:
        return self.dataset.num_examples

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """Frames for global example indices (``epoch = index // len(self)``): ``int32[n, seq_len]``."""
        epoch, row = split_indices(indices, len(self))
        rows = Rows(jnp.asarray(row, dtype=jnp.uint32), jnp.asarray(epoch.astype(np.uint32)))
        return _frames(self.device, rows)

    def frames_at(self, doc, t, s) -> Batch:
        """Frames for explicit placements, ``copy_len = min(K, L - t, S - s)`` (the seed's Example
        Construction; ``L`` in place of ``L - t`` for cyclic_roll), outside the schedule.

        Raises:
            ValueError: for a ``doc``, ``t`` or ``s`` outside its range, naming it.
        """
        doc, t, s = (
            np.atleast_1d(check_int_array(n, x)).astype(np.int64)
            for n, x in (("doc", doc), ("t", t), ("s", s))
        )
        lengths = self.dataset.doc_lengths
        for name, value, high in (("doc", doc, lengths.shape[0]), ("s", s, self.spec.seq_len)):
            if value.min() < 0 or value.max() >= high:
                raise ValueError(f"{name}={value.tolist()} must lie in [0, {high})")
        if t.min() < 0 or (t >= lengths[doc]).any():
            raise ValueError(f"t={t.tolist()} must lie in [0, doc length {lengths[doc].tolist()})")
        suffix = lengths[doc] if self.dataset.cyclic else lengths[doc] - t
        copy_len = np.minimum(np.minimum(suffix, self.spec.content_length or suffix), self.spec.seq_len - s)
        as32 = partial(jnp.asarray, dtype=jnp.int32)
        return pool_frames(self.pool, as32(doc), as32(t), as32(s), as32(copy_len), **self.frame_args)


def splice_batch(docs: Sequence[np.ndarray], indices: Sequence[int] | np.ndarray, **spec) -> Batch:
    """Frames ``int32[len(indices), seq_len]`` and ``doc_idx`` for ``indices`` of the splice dataset."""
    return SpliceDataset(docs, **spec).get_batch(indices)


def splice_validation_set(docs: Sequence[np.ndarray], *, starts: int = 3, offsets: int = 3, **spec) -> Batch:
    """The seed's validation set: every document at a fixed small grid of ``(t, s)`` (see
    ``validation_rows``), as one batch with ``doc_idx``."""
    data = SpliceDataset(docs, **spec)
    doc, t, s, copy_len = validation_rows(data.schedule, starts=starts, offsets=offsets)
    return pool_frames(data.pool, doc, t, s, copy_len, **data.frame_args)
