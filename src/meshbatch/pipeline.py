"""The spine: plan -> fetch -> build, per process, into globally sharded batches.

Step ``k``'s batch holds examples ``offset(k) .. offset(k) + batch_size(k) - 1`` of an endless
stream; stream index ``g`` is position ``g mod n`` of epoch ``g // n`` (``n`` examples per epoch).
The host splits those (unbounded) integers into 32-bit (position, epoch) pairs, then:

1. plan (jitted, host CPU device): each row's example, from the dataset's shuffle;
2. fetch (host): the rows' token spans, coalesced, read once per process;
3. build (jitted, per device shard on a local mesh): ``Batch`` rows from the tokens.

Datasets whose tokens live on device (``fetches = False``) skip 1-2 on the host: plan and build
run together in the per-shard kernel. Nothing here depends on how many processes or devices share
the batch: every process computes the same global batch's rows for its own devices.

    pipeline = Pipeline(CausalLMDataset(cache, 4096), mesh=mesh, batch_size=256, key=key)
    for batch in pipeline.iterate_from(step):   # O(1) to resume anywhere
        ...
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import PRNGKeyArray

from meshbatch.kernels import Batch

from .layout import RowLayout
from .prefetch import EndOfStream, Prefetcher, check_prefetch
from .schedule import BatchSchedule

logger = logging.getLogger(__name__)
INT32_MAX = 2**31 - 1


class Pipeline:
    """Global batches of a dataset on a mesh, step by step; see the module docstring.

    Args:
        dataset: a dataset plan (``CausalLMDataset``, a splice dataset, ...).
        mesh: the device mesh the batch is sharded over.
        batch_size: global rows per step: an int, a ``BatchSchedule`` or ``(start_step, size)`` pairs.
        key: the data key; the dataset's shuffles derive from it.
        data_axes: mesh axis name(s) the batch dimension is sharded over.
        prefetch: batches kept ready (or in the making) by ``iterate_from``.
        workers: threads making batches concurrently in ``iterate_from`` (reads and host copies
            release the GIL, so steps overlap).
        max_epochs: stop before the first step that would read past this many epochs; ``None``
            streams forever (later epochs reshuffle if the dataset's shuffle asks for it).
    """

    def __init__(
        self,
        dataset,
        *,
        mesh: Mesh,
        batch_size,
        key: PRNGKeyArray,
        data_axes: str | tuple[str, ...] = "data",
        prefetch: int = 4,
        workers: int = 2,
        max_epochs: int | None = None,
    ):
        self.dataset = dataset
        self.mesh = mesh
        self.data_axes = (data_axes,) if isinstance(data_axes, str) else tuple(data_axes)
        self.schedule = batch_size if isinstance(batch_size, BatchSchedule) else BatchSchedule(batch_size)
        if max_epochs is not None and (
            not isinstance(max_epochs, int | np.integer) or isinstance(max_epochs, bool) or max_epochs < 1
        ):
            raise ValueError(f"max_epochs must be a positive int or None (got max_epochs={max_epochs!r})")
        check_prefetch(prefetch, workers)
        self.max_epochs = None if max_epochs is None else int(max_epochs)
        self.prefetch, self.workers = prefetch, workers
        self._layouts = {b: RowLayout.create(mesh, self.data_axes, b) for b in self.schedule.unique_sizes()}
        self._cpu = jax.local_devices(backend="cpu")[0]
        state = dataset.plan_state(key)
        if dataset.fetches:  # the host plans; device-resident datasets plan on their devices
            self._plan_state = jax.device_put(state, self._cpu)
            self._plan = jax.jit(dataset.plan)
        # Every batch size builds on the same local devices: one replicated copy of the state.
        local_mesh = next(iter(self._layouts.values())).local_mesh
        build_state = jax.device_put(state, jax.sharding.NamedSharding(local_mesh, PartitionSpec()))
        del state
        self._build = {b: self._compile_build(layout, build_state) for b, layout in self._layouts.items()}
        self._num_steps = self._count_steps()

    def _compile_build(self, layout: RowLayout, build_state):
        local = PartitionSpec("local")
        dataset = self.dataset
        if dataset.fetches:

            def per_shard(state, content, planned):
                return dataset.build(state, content, planned)

        else:

            def per_shard(state, positions, epochs):
                return dataset.build(state, None, dataset.plan(state, positions, epochs))

        in_specs = (PartitionSpec(), local, local)  # state replicated, row inputs split by device
        kernel = jax.jit(jax.shard_map(per_shard, mesh=layout.local_mesh, in_specs=in_specs, out_specs=local))
        return lambda a, b: kernel(build_state, a, b)

    # -- host arithmetic ----------------------------------------------------------------------

    def num_steps(self) -> int | None:
        """Steps before ``max_epochs`` would be exceeded, or ``None`` for an endless stream."""
        return self._num_steps

    def _count_steps(self) -> int | None:
        if self.max_epochs is None:
            return None
        total = self.max_epochs * self.dataset.num_examples
        low, high = 0, 1
        while self.schedule.offset(high) + self.schedule.batch_size(high) <= total:
            high *= 2
        while low < high:  # first step whose batch does not fit
            mid = (low + high) // 2
            if self.schedule.offset(mid) + self.schedule.batch_size(mid) <= total:
                low = mid + 1
            else:
                high = mid
        return low

    def _positions(self, step: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """32-bit (position, epoch) of each batch row of ``step``; the big integers stay here."""
        n = self.dataset.num_examples
        epoch0, position0 = divmod(self.schedule.offset(step), n)  # Python ints: never wrap
        last_epoch = epoch0 + (position0 + self.schedule.batch_size(step) - 1) // n
        if last_epoch > 2**32 - 1:
            raise OverflowError(f"step={step} reaches epoch {last_epoch} >= 2**32")
        position = position0 + rows.astype(np.int64)  # < n + batch_size < 2**33
        epoch = np.uint32(epoch0) + (position // n).astype(np.uint32)
        return (position % n).astype(np.uint32), epoch

    # -- one step ----------------------------------------------------------------------------------

    def batch(self, step: int) -> Batch:
        """The global batch of ``step`` (blocking; ``iterate_from`` overlaps steps)."""
        step = _as_step(step)
        steps = self.num_steps()
        if steps is not None and step >= steps:
            raise IndexError(
                f"step={step} is past the end: max_epochs={self.max_epochs} allows {steps} steps"
            )
        layout = self._layouts[self.schedule.batch_size(step)]
        if self.dataset.fetches:
            local = self._fetch_and_build(step, layout)
        else:
            per_device = [self._positions(step, np.arange(a, b)) for a, b in layout.device_rows]
            local = self._build[layout.batch_size](
                layout.stack_local([p for p, _ in per_device]), layout.stack_local([e for _, e in per_device])
            )
        return jax.tree.map(layout.to_global, local)

    def _fetch_and_build(self, step: int, layout: RowLayout):
        positions, epochs = self._positions(step, layout.rows)
        planned = self._plan(
            self._plan_state, jax.device_put(positions, self._cpu), jax.device_put(epochs, self._cpu)
        )
        planned = jax.tree.map(np.asarray, planned)

        span_starts, span_lengths = self.dataset.spans(planned)
        read = self.dataset.source.read_runs(span_starts, span_lengths)
        seq_len = self.dataset.seq_len
        contents, plans = [], []
        for first, stop in layout.device_rows:
            index = np.searchsorted(layout.rows, np.arange(first, stop))
            contents.append(_windows(read.buffer, read.span_starts[index], span_lengths[index], seq_len))
            plans.append(jax.tree.map(lambda leaf, index=index: leaf[index], planned))

        content = layout.stack_local(contents)
        planned_local = jax.tree.map(lambda *leaves: layout.stack_local(list(leaves)), *plans)
        return self._build[layout.batch_size](content, planned_local)

    # -- streams ----------------------------------------------------------------------------------

    def iterate_from(self, step: int = 0) -> Prefetcher[Batch]:
        """Batches ``step, step + 1, ...`` with ``prefetch`` of them kept ready in the background.

        Resuming costs the same at step 10**9 as at step 1: nothing is replayed. The returned
        iterator's ``stats()`` reports how long the consumer waited for each batch; use it as a
        context manager (or ``close()`` it) to stop its threads early.
        """
        return Prefetcher(self._produce, start=_as_step(step), depth=self.prefetch, workers=self.workers)

    def _produce(self, step: int) -> Batch:
        steps = self.num_steps()
        if steps is not None and step >= steps:
            raise EndOfStream
        batch = self.batch(step)
        jax.block_until_ready(batch)  # ready means ready: the consumer's wait is the real wait
        return batch

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate_from(0)


def _as_step(step) -> int:
    """``step`` as a Python int (numpy ints included), refusing anything else or a negative."""
    try:
        value = operator.index(step)
    except TypeError:
        raise ValueError(f"step must be a non-negative int (got step={step!r})") from None
    if isinstance(step, bool) or value < 0:
        raise ValueError(f"step must be a non-negative int (got step={step!r})")
    return value


def _windows(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """``[rows, seq_len]`` int32: each span's tokens left-aligned, zero after its length."""
    if buffer.size and (buffer.dtype.itemsize > 4 or buffer.dtype == np.uint32):
        low, top = int(buffer.min()), int(buffer.max())
        if low < -INT32_MAX - 1 or top > INT32_MAX:
            raise OverflowError(f"token id {top if top > INT32_MAX else low} does not fit int32")
    if np.all(lengths == seq_len) and buffer.shape[0] >= seq_len:
        # Whole rows: index a strided window view, so numpy copies contiguous rows, not tokens.
        return np.lib.stride_tricks.sliding_window_view(buffer, seq_len)[starts].astype(np.int32, copy=False)
    out = np.zeros((starts.shape[0], seq_len), np.int32)
    for row, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
        out[row, :length] = buffer[start : start + length]
    return out
