"""The spine: plan -> fetch -> build, per process, into globally sharded batches.

Step ``k``'s batch holds examples ``offset(k) .. offset(k) + batch_size(k) - 1`` of an endless
stream; stream index ``g`` is position ``g mod n`` of epoch ``g // n`` (``n`` examples per epoch).
The host splits those (unbounded) integers into 32-bit ``Rows``, then, for any ``Dataset``:

0. make (once): the dataset's device half and host half for the key (``dataset.make(key)``);
1. plan (jitted, host CPU device): each row's example (``device.plan``);
2. fetch (host): the rows' spans (``host.spans``), coalesced per source, one flat buffer per
   device (``fetch``);
3. build (jitted, per device shard on a local mesh): ``device.build``, then the build stages.

The programs are module-level (``programs``) and take the device half as an argument: a second
pipeline over an equal dataset, with any key, compiles nothing new.

Datasets without sources and without state skip 1-2 on the host: plan and build run together in
the per-shard kernel. A stateful dataset is planned over the whole global batch, in step order,
by every process, so its state is the same everywhere; ``state_dict()`` checkpoints it. Nothing
depends on how many processes or devices share the batch. Over a source still being written
(quick start), each step first waits for its rows (``Dataset.wait_for``); once the length is final
the pipeline makes the final dataset (a new value) for the same key and swaps it in.

    pipeline = Pipeline(CausalLMDataset(cache, 4096), mesh=mesh, batch_size=256, key=key)
    with pipeline.iterate_from(step) as batches:   # O(1) to resume anywhere (stateless data)
        ...

Warm-up: a new pipeline starts making its first step's batch at once, in a background thread
(``Warm``): compiling its programs and reading its tokens while the caller does other work (builds
its model). The step the stream will most likely start at gets it: ``iterate_from`` / ``batch``
take it when their step is that step (it is the same batch: same step, same state), and discard
it otherwise, after it is made (so nothing of it runs beside the step asked for).

Lifetime: nothing running holds a pipeline or a stream. Stream workers and the warm-up thread
hold the pipeline weakly (``_weak_produce``), the pipeline holds its latest stream weakly, and a
stream holds its pipeline (so a stream alone keeps making batches). A dropped stream stops its
workers (``Prefetcher``'s finalizer); a dropped pipeline with no stream is collected, its warm
batch with it.

The end of a finite stream (``max_epochs``): ``total = max_epochs * n`` rarely ends on a step
boundary. ``pad_final_batch=False`` stops before the step it ends inside; ``True`` yields that
step too, its rows past the end zeros in every leaf (``_pad_rows``), as Levanter's
``DataLoader(pad_final_batch=True)`` pads (``tree_zeros_like`` of an example). Same shape, same
compiled build: the zeroing is host work on the few shards that hold padding rows.

    total 106, batch 8:  drop -> 13 steps;  pad -> 14 steps, step 13 holds rows 104, 105 and 6 zero rows
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshbatch.arguments import as_key, check_bool, check_int, check_names, check_optional_int, check_step
from meshbatch.datasets.protocol import BuildStage, Content, Dataset, Plan, Rows
from meshbatch.datasets.provenance import Provenance, RowSources, content_fingerprint
from meshbatch.kernels import Batch

from ..batch_schedule import BatchSchedule
from .fetch import fetch
from .prefetch import EndOfStream, Prefetcher, check_prefetch, host_work_done, join_at_exit
from .programs import build_program, plan_program
from .row_layout import RowLayout
from .state_planner import StatePlanner
from .telemetry import StreamLog, bind, phase, read_counters, record_read

logger = logging.getLogger(__name__)
STATE_VERSION = 1


class Pipeline:
    """Global batches of a dataset on a mesh, step by step; see the module docstring.

    Args:
        dataset: any ``meshbatch.datasets.Dataset`` (``CausalLMDataset``, a splice dataset, ...).
        mesh: the device mesh the batch is sharded over.
        batch_size: global rows per step: an int, a ``BatchSchedule`` or ``(start_step, size)`` pairs.
        key: the data key (a typed key or an int seed); every shuffle of the dataset derives from it.
        data_axes: mesh axis name(s) the batch dimension is sharded over.
        prefetch: batches kept ready (or in the making) by ``iterate_from``, or ``"auto"``: adapted
            to the measured read latency and step time (``auto_depth.AutoDepth``; up to 8).
        workers: threads making batches concurrently in ``iterate_from``.
        max_epochs: end the stream after this many epochs (``pad_final_batch`` says how);
            ``None`` streams forever (later epochs reshuffle if the dataset's shuffle asks for it).
        pad_final_batch: with ``max_epochs``, where the last epoch ends inside a step: ``False``
            (the default) stops before that step; ``True`` yields it too, its rows past the end
            zeros in every leaf (loss mask 0), as Levanter's ``DataLoader(pad_final_batch=True)``
            pads (see the module docstring; same shapes, nothing recompiles).
        stages: build stages applied per shard after ``build`` (``BuildStage``), in order.
        state: a ``state_dict()`` to start from (a stateful dataset's checkpoint).
        warmup: start making the first step's batch (step 0, or ``state``'s step) at once, in the
            background (see the module docstring; ``ready``, ``warmup()``). A dataset still
            being written (quick start) is not warmed up unless ``warmup()`` is called.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        mesh: Mesh,
        batch_size,
        key,
        data_axes: str | tuple[str, ...] = "data",
        prefetch: int | str = 4,
        workers: int = 2,
        max_epochs: int | None = None,
        pad_final_batch: bool = False,
        stages: Sequence[BuildStage] = (),
        state: dict[str, Any] | None = None,
        warmup: bool = True,
    ):
        if not isinstance(dataset, Dataset):
            raise TypeError(f"dataset must be a meshbatch Dataset (got {type(dataset).__name__})")
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a jax.sharding.Mesh (got mesh={mesh!r})")
        self.dataset, self.mesh = dataset, mesh
        self.data_axes = check_names("data_axes", data_axes)
        self.schedule = batch_size if isinstance(batch_size, BatchSchedule) else BatchSchedule(batch_size)
        self.max_epochs = check_optional_int("max_epochs", max_epochs, low=1)
        self.pad_final_batch = check_bool("pad_final_batch", pad_final_batch)
        check_prefetch(prefetch, workers, depth_name="prefetch")
        self.prefetch, self.workers = prefetch, workers
        if not isinstance(stages, Sequence) or isinstance(stages, str):
            raise TypeError(f"stages must be a sequence of build stages (got stages={stages!r})")
        self.stages = tuple(stages)
        for i, stage in enumerate(self.stages):
            if not callable(stage):
                raise TypeError(f"stages[{i}] must be a callable (batch, plan) -> Batch (got {stage!r})")
        self._layouts = {b: RowLayout.create(mesh, self.data_axes, b) for b in self.schedule.unique_sizes()}
        self._key = as_key(key)
        initial = dataset.init_state()
        self._planner = None if initial is None else StatePlanner(self._plan_global, 0, initial)
        self._host_plans = dataset.fetches or self._planner is not None
        if self._host_plans:  # the host plans; stateless device-resident datasets plan on their devices
            self._cpu = jax.local_devices(backend="cpu")[0]
        self._make_dataset(dataset)
        self._growing = threading.Lock()
        self._final = dataset.length_is_final
        self._num_steps = self._count_steps()
        self._next_step = 0
        self._warm: Warm | None = None
        self._warm_lock = threading.Lock()
        self._stream = None  # a weak reference to the latest stream
        self._stream_log: StreamLog | None = None
        if state is not None:
            self.load_state_dict(state)
        if logger.isEnabledFor(logging.INFO):  # for the run's log: what the data was drawn from
            logger.info(
                "pipeline over a %s of %d sources: content fingerprint %s",
                type(self._host).__name__,
                len(self._host.sources),
                self.content_fingerprint(),
            )
        if check_bool("warmup", warmup) and self._final:
            with self._warm_lock:
                self._start_warmup_locked(self._next_step)

    def _make_dataset(self, dataset: Dataset) -> None:
        """The dataset's device half for the pipeline's key, on the host CPU (to plan) and
        replicated on the local devices (to build; every batch size builds on the same devices),
        and its host half (spans, lengths)."""
        device, self._host = dataset.make(self._key)
        self._device_half = device  # provenance plans a device-resident dataset's rows with it
        if self._host_plans:
            self._plan_device = jax.device_put(device, self._cpu)
        local_mesh = next(iter(self._layouts.values())).local_mesh
        arrays, static = eqx.partition((device, self.stages), eqx.is_array)  # inputs; the program's key
        self._build_arrays = jax.device_put(arrays, NamedSharding(local_mesh, PartitionSpec()))
        self._build = {b: build_program(static, layout.local_mesh, self._host_plans)
                       for b, layout in self._layouts.items()}  # fmt: skip

    def _run_build(self, batch_size: int, *inputs):
        kernel, shardings = self._build[batch_size]
        if jax.process_count() > 1:  # jit refuses numpy for a sharded input: place them first
            with phase("place"):
                inputs = jax.device_put(inputs, shardings[1:])
        with phase("build"):  # one process: the call also places its numpy inputs
            return kernel(self._build_arrays, *inputs)

    # -- host arithmetic ----------------------------------------------------------------------

    def num_steps(self) -> int | None:
        """Steps of ``max_epochs`` epochs (the partial last one only with ``pad_final_batch``), or
        ``None`` for an endless stream."""
        return self._num_steps

    def _count_steps(self) -> int | None:
        if self.max_epochs is None or not self._host.length_is_final:
            return None
        return self.schedule.steps_within(self.max_epochs * self._host.num_examples, self.pad_final_batch)

    def _real_rows(self, step: int) -> int:
        """Rows of ``step`` that hold examples: all but in a padded final step."""
        if self._num_steps is None:  # endless, or a length not final yet
            return self.schedule.batch_size(step)
        return self.schedule.rows_within(step, self.max_epochs * self._host.num_examples)

    def _rows(self, step: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.schedule.rows(step, rows, self._host.num_examples)

    def _plan_rows(self, step: int, rows: np.ndarray, state=None):
        # The rows go in as numpy (jit moves them to the planning device); a state is committed
        # there like the states plan returns (one compile, not two).
        if state is not None:
            state = jax.device_put(state, self._cpu)
        with jax.default_device(self._cpu):
            plan, state = plan_program(self._plan_device, Rows(*self._rows(step, rows)), state)
        return jax.tree.map(np.asarray, plan), state

    def _plan_global(self, step: int, state):
        plan, after = self._plan_rows(step, np.arange(self.schedule.batch_size(step)), state)
        self._host.check_state(step, state, after)  # refused here, before the state is kept
        return plan, after

    # -- one step ----------------------------------------------------------------------------------

    def batch(self, step: int) -> Batch:
        """The global batch of ``step`` (blocking; ``iterate_from`` overlaps steps).

        Taking it moves the checkpoint position (``state_dict``) to ``step + 1``.
        """
        step = check_step(step)
        if self._planner is not None:
            self._planner.warn_if_replay(step)
        with self._warm_lock:
            warm = self._claim_warm_locked(step)
        # the warm batch is taken outside the lock (waiting for it; raising what making it raised)
        batch = self._make(step) if warm is None else warm.take()
        self._took(step)
        return batch

    # -- warm-up ----------------------------------------------------------------------------------

    def ready(self, step: int = 0) -> bool:
        """Whether the warm batch of ``step`` is made and waiting (``warmup``): the first
        ``batch(step)`` or ``iterate_from(step)`` then waits for nothing."""
        warm = self._warm
        return warm is not None and warm.step == check_step(step) and warm.done.is_set()

    def warmup(self, step: int | None = None) -> None:
        """Blocks until the batch of ``step`` (default: the warm-up's step, else the next step
        the consumer takes) is made and kept for the first ``batch(step)`` / ``iterate_from(step)``;
        starts making it if no warm-up for ``step`` is under way (``warmup=False``, or another
        step). Raises what making it raised (the step that takes it raises it again)."""
        with self._warm_lock:
            warm = self._warm
            if step is None:
                step = warm.step if warm is not None else self._next_step
            step = check_step(step)
            if warm is None or warm.step != step:
                self._discard_warm_locked()
                warm = self._start_warmup_locked(step)
        warm.result()

    def _start_warmup_locked(self, step: int) -> Warm:
        warm = Warm(step, read_counters(self.dataset))
        past_end = self._past_end(step)
        if past_end is not None:  # nothing to make: the stream ends before it
            warm.finish(False, past_end)
        else:
            warm.start(weakref.ref(self))
        self._warm = warm
        return warm

    def _discard_warm_locked(self) -> None:
        """Drops the warm batch, once it is made: nothing of it runs beside what comes next (its
        reads and planning counted, a stateful plan's state moved)."""
        warm, self._warm = self._warm, None
        if warm is not None:
            warm.done.wait()

    def _claim_warm_locked(self, step: int) -> Warm | None:
        """The warm-up, no longer the pipeline's, if it is ``step``'s; else ``None``, the warm
        batch of another step discarded."""
        warm = self._warm
        if warm is not None and warm.step != step:
            self._discard_warm_locked()
            return None
        self._warm = None
        return warm

    def _grow(self, step: int) -> None:
        """Quick start: wait until the rows of ``step`` are written; once the dataset's length is
        final, make the final dataset (same key), swap it in and count the steps ``max_epochs``
        allows."""
        with self._growing:
            if self._final:
                return
            final = self._host.wait_for(self.schedule.offset(step) + self.schedule.batch_size(step))
            if final is not None:
                self.dataset = final
                self._make_dataset(final)
                self._num_steps = self._count_steps()
                self._final = True  # only now: a step of the last era must see the final tables

    def _reach(self, step: int) -> None:
        """Grows a dataset still being written up to ``step``; refuses a step past a finite end."""
        if not self._final:
            self._grow(step)
        past_end = self._past_end(step)
        if past_end is not None:
            raise past_end

    def _past_end(self, step: int) -> IndexError | None:
        """The error of a step past the end of a finite stream, if ``step`` is one."""
        steps = self.num_steps()
        if steps is None or step < steps:
            return None
        return IndexError(f"step={step} is past the end: max_epochs={self.max_epochs} allows {steps} steps")

    def _make(self, step: int) -> Batch:
        self._reach(step)
        layout = self._layouts[self.schedule.batch_size(step)]
        # Every per-device input is stacked on the host; the build's jit places them all at once.
        if not self._host_plans:
            with phase("plan"):
                per_device = [self._rows(step, np.arange(a, b)) for a, b in layout.device_rows]
                rows = Rows(*(np.concatenate([r[i] for r in per_device]) for i in range(2)))
            local = self._run_build(layout.batch_size, rows)
        else:
            local = self._run_build(layout.batch_size, *self._host_inputs(step, layout))
        with phase("global"):
            batch = jax.tree.map(layout.to_global, local)
        real = self._real_rows(step)
        if real < layout.batch_size:  # the padded final step (pad_final_batch)
            with phase("pad"):
                batch = _pad_rows(batch, real)
        return batch

    def _host_inputs(self, step: int, layout: RowLayout) -> tuple[Plan, Content | None]:
        """The build's inputs when the host plans: this process's rows' plan, stacked per device,
        and their tokens fetched (``None`` for a dataset without sources)."""
        with phase("plan"):
            if self._planner is None:
                plan, _ = self._plan_rows(step, layout.rows)
            else:
                plan = jax.tree.map(lambda leaf: leaf[layout.rows], self._planner.plan(step))
        content = None
        if self._host.fetches:
            with phase("fetch"):
                tokens, offsets = fetch(self._host, self._host.spans(plan), layout)
                content = Content(tokens.reshape(-1), offsets.reshape(-1, offsets.shape[-1]))
        with phase("stack"):
            return layout.stack_rows(plan), content

    # -- provenance ---------------------------------------------------------------------------------

    def provenance(self, step: int, state: dict[str, Any] | None = None) -> Provenance:
        """Where every row of ``step`` came from: its stream coordinates, its component (in a
        mixture), example, source, document (row) id, token range and place in the row
        (``meshbatch.datasets.provenance``). Computed from the step's plan, without reading a
        token: the same work as planning one step, at any step of a stateless dataset.

        A stateful dataset (token-balanced) plans from ``state``, a ``state_dict()`` saved before
        ``step`` (as a checkpoint holds it; its ``step`` must be ``step``), else from the states
        this pipeline holds (the steps it has planned; others replay from the last one it knows,
        as ``batch`` does). Neither moves the stream.

        Raises:
            IndexError: ``step`` past the end of a finite stream.
            ValueError: a ``state`` of another step, or one given for a stateless dataset.
        """
        step = check_step(step)
        self._reach(step)
        rows = np.arange(self.schedule.batch_size(step))
        if self._planner is None:
            if state is not None:
                raise ValueError(f"{type(self.dataset).__name__} is stateless: provenance takes no state")
            if self._host_plans:
                plan, _ = self._plan_rows(step, rows)
            else:  # planned on its devices: planned here with the device half, where it was made
                plan, _ = plan_program(self._device_half, Rows(*self._rows(step, rows)), None)
        else:
            if state is None:
                before = self._planner.state(step)
            else:
                before = self._host.load_state_dict(split_state(state, step)[2])
            plan, _ = self._plan_rows(step, rows, before)
        plan = jax.tree.map(np.asarray, plan)
        sources = self._host.provenance(plan)
        position, epoch = self._rows(step, rows)
        padding = rows >= self._real_rows(step)
        if padding.any():  # a padded final step's zero rows came from nowhere
            sources.put(np.flatnonzero(padding), RowSources.empty(int(padding.sum()), sources.slots))
        offset = self.schedule.offset(step)
        return Provenance(
            step=step,
            stream_index=np.asarray([offset + int(r) for r in rows], object),
            position=np.asarray(position, np.int64),
            epoch=np.asarray(epoch, np.int64),
            padding=padding,
            rows=sources,
        )

    def content_fingerprint(self) -> str:
        """A digest of what the dataset draws from (``datasets.provenance.content_fingerprint``):
        its components, their caches' identities and the weights. Keep it with checkpoints and
        logs: a re-bucketed or rewritten corpus gives another one."""
        return content_fingerprint(self._host)  # the host half: a packing made for the key known

    # -- checkpoints --------------------------------------------------------------------------------

    def _took(self, step: int) -> None:
        self._next_step = step + 1
        if self._planner is not None:
            self._planner.forget_before(self._next_step)

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able checkpoint of the stream at the next step the consumer will take.

        ``{"version": 1, "step": k, "content": fingerprint, ...}`` plus the dataset's own state (a
        token-balanced mixture's per-source offsets); ``Pipeline(..., state=...)`` or
        ``load_state_dict`` resume from it, and ``iterate_from(state=...)`` streams from it.
        ``content`` is ``content_fingerprint()``: a resume over other data (a re-bucketed corpus,
        a rewritten cache, other weights) says so in a WARNING line naming both fingerprints.
        """
        out: dict[str, Any] = {
            "version": STATE_VERSION,
            "step": self._next_step,
            "content": self.content_fingerprint(),
        }
        if self._planner is not None:
            out.update(self._host.state_dict(self._planner.state(self._next_step)))
        return out

    def load_state_dict(self, state: dict[str, Any], step: int | None = None) -> None:
        """Resume from a ``state_dict()``, or from a bare ``{"datasets": [...]}`` state.

        The next step is the state's ``step``; a bare state has none (nor a ``version``), so it
        resumes at ``step``, which must then be given (the step the checkpoint was saved before:
        the first step not yet trained). Given both, they must agree.

            load_state_dict({"version": 1, "step": 120, "datasets": [...]})   # next step 120
            load_state_dict({"datasets": [...]}, step=120)                     # the same
            load_state_dict({"datasets": [...]})   # ValueError: ... pass step=

        Raises:
            TypeError, ValueError: a malformed checkpoint, naming what is wrong.
        """
        step, content, rest = split_state(state, step)
        if content is not None and content != self.content_fingerprint():
            logger.warning(
                "resuming at step %d from a checkpoint of other data: its content fingerprint is %s, this "
                "pipeline's %s (another corpus, a rewritten cache or other weights: the rows of a step "
                "are not the checkpointed run's)",
                step,
                content,
                self.content_fingerprint(),
            )
        if self._planner is None:
            if rest:
                raise ValueError(f"{type(self.dataset).__name__} is stateless; state has keys {sorted(rest)}")
        else:
            state = self._host.load_state_dict(rest)
            with self._warm_lock:  # the warm batch was planned from another state
                self._discard_warm_locked()
                self._planner.reset(step, state)
        self._next_step = step

    # -- streams ----------------------------------------------------------------------------------

    def iterate_from(
        self, step: int | None = None, *, state: dict[str, Any] | None = None
    ) -> Prefetcher[Batch]:
        """Batches ``step, step + 1, ...`` with ``prefetch`` of them kept ready in the background.

        With ``state`` (a ``state_dict()``), the stream resumes from it (``step`` defaults to its
        step and must equal it; a bare ``{"datasets": [...]}`` has no step: ``step`` is then
        required, see ``load_state_dict``). Stateless datasets resume in O(1) at any step: nothing
        is replayed. The returned iterator's ``stats()`` reports how long the consumer waited for
        each batch; use it as a context manager (or ``close()`` it) to stop its threads early.
        """
        if state is not None:
            self.load_state_dict(state, step)
            step = self._next_step
        start = 0 if step is None else check_step(step)
        if self._planner is not None:
            self._planner.warn_if_replay(start)
        with self._warm_lock:  # the warm batch goes to the stream if it is its first step's
            warm = self._claim_warm_locked(start)
            # counted before the workers start (shared programs: a step may read at once), or
            # before the warm batch the stream takes was read
            self._stream_counters = warm.counters if warm is not None else read_counters(self.dataset)
        # Lifetime (module docstring): the stream holds the pipeline (``on_take``), not vice versa.
        stream = Prefetcher(
            _weak_produce(weakref.ref(self), warm),
            start=start,
            depth=self.prefetch,
            workers=self.workers,
            on_take=self._took,
        )
        self._stream, self._stream_log = weakref.ref(stream), stream.log
        return stream

    def stats(self) -> dict[str, float]:
        """What the latest ``iterate_from`` stream measured: consumer wait p50/p95/p99/max, stall
        fraction of the consumer's time, read latency p50/p99, bytes and requests per example,
        prefetch occupancy; ``{}`` before any stream.

        ``requests_per_example`` counts TensorStore reads (one per coalesced run and shard) and
        ``bytes_per_example`` the bytes they decoded, per example made since the stream began (the
        zero rows of a padded final step are no examples)."""
        if self._stream_log is None:
            return {}
        stream = self._stream()
        out = dict(stream.stats() if stream is not None else self._stream_log.summary())
        examples = sum(self._real_rows(step) for step, _ in list(self._stream_log.made))
        now = read_counters(self.dataset)
        out["examples_made"] = examples
        for key, name in (("reads_issued", "requests_per_example"), ("bytes_read", "bytes_per_example")):
            out[name] = (now[key] - self._stream_counters[key]) / examples if examples else 0.0
        return out

    def serve_metrics(self, *, port: int = 0, addr: str = "127.0.0.1"):
        """``stats()`` as Prometheus metrics at ``http://addr:port/metrics`` (``port=0``: a free
        one), Grain's names where the meaning is the same (docs/observing.md); returns the server
        (``url``, ``close()``). Needs the ``prometheus`` extra."""
        from .telemetry import serve_metrics

        return serve_metrics(self, port=port, addr=addr)

    def reset_stats(self) -> None:
        """Start ``stats()`` afresh on the latest stream: its measurements and the read counters
        behind ``requests_per_example`` / ``bytes_per_example`` (a step made across the reset may
        count its examples or its reads on either side). A per-report window, as the Levanter
        adapter logs it; nothing to do before any stream."""
        if self._stream_log is not None:
            self._stream_counters = read_counters(self.dataset)
            self._stream_log.clear()

    def _produce(self, step: int, warm: Warm | None = None) -> Batch:
        if self._past_end(step) is not None:
            raise EndOfStream
        if warm is not None:
            return warm.take()
        batch = self._make(step)
        if self.mesh.devices.flat[0].platform != "cpu":  # on CPU devices the build is host work too
            host_work_done()
        jax.block_until_ready(batch)  # ready means ready: the consumer's wait is the real wait
        return batch

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate_from(0)


def _pad_rows(tree, real: int):
    """``tree`` of global ``[batch, ...]`` arrays with rows ``real`` and on set to zero.

    Every process zeroes its own shards: a shard wholly before ``real`` stays as built; one
    holding padding rows is copied to the host, zeroed there and put back on its device.
    """

    def leaf(array: jax.Array) -> jax.Array:
        by_device = {}
        for shard in array.addressable_shards:
            start, stop, _ = shard.index[0].indices(array.shape[0])
            if stop <= real:
                by_device[shard.device] = shard.data
                continue
            host = np.array(shard.data)  # a writable copy
            host[max(real - start, 0) :] = 0
            by_device[shard.device] = jax.device_put(host, shard.device)
        order = array.sharding.addressable_devices_indices_map(array.shape)
        return jax.make_array_from_single_device_arrays(
            array.shape, array.sharding, [by_device[device] for device in order]
        )

    return jax.tree.map(leaf, tree)


def _weak_produce(ref: weakref.ref[Pipeline], warm: Warm | None):
    """A stream's ``produce`` holding its pipeline weakly (a collected pipeline ends the stream);
    the worker making ``warm``'s step takes the warm batch."""

    def produce(step: int) -> Batch:
        nonlocal warm
        pipeline = ref()
        if pipeline is None:
            raise EndOfStream
        if warm is not None and warm.step == step:  # one worker makes each step: no race
            taken, warm = warm, None
            return pipeline._produce(step, taken)
        return pipeline._produce(step)

    return produce


class Warm:
    """One warm-up: the batch of ``step`` made by a background thread (``Pipeline(warmup=True)``).

    Holds no reference to its pipeline: the thread holds it weakly, and strongly only while it
    makes the batch. ``counters`` are the sources' read counters before it started (a stream that
    takes the batch counts its reads); ``log`` its reads' latencies.
    """

    def __init__(self, step: int, counters: dict[str, int]):
        self.step, self.counters = step, counters
        self.log = StreamLog()
        self.done = threading.Event()
        self._outcome: tuple[bool, object] | None = None

    def start(self, ref: weakref.ref[Pipeline]) -> None:
        thread = threading.Thread(target=self._run, args=(ref,), name="meshbatch-warmup", daemon=True)
        join_at_exit(thread)
        thread.start()

    def _run(self, ref: weakref.ref[Pipeline]) -> None:
        bind(self.log)
        pipeline = ref()
        if pipeline is None:
            self.finish(False, RuntimeError(f"the pipeline warming up step {self.step} was collected"))
            return
        try:
            batch = pipeline._make(self.step)
            del pipeline  # a pipeline dropped meanwhile is collected once its batch is made
            jax.block_until_ready(batch)
            self.finish(True, batch)
        except BaseException as error:  # raised at the step that takes it (or by warmup())
            logger.debug("warming up step %d failed: %r", self.step, error)
            self.finish(False, error)

    def finish(self, ok: bool, value: object) -> None:
        self._outcome = (ok, value)
        self.done.set()

    def take(self) -> Batch:
        """``result()``, its reads recorded in the calling thread's stream log (the stream that
        takes the batch counts them)."""
        batch = self.result()
        for seconds in self.log.reads:
            record_read(seconds)
        return batch

    def result(self) -> Batch:
        """The batch, once made; raises what making it raised."""
        self.done.wait()
        ok, value = self._outcome
        if not ok:
            raise value
        return value


def split_state(state, given: int | None) -> tuple[int, str | None, dict[str, Any]]:
    """A ``state_dict()`` (or a bare ``{"datasets": [...]}``) checked and split into the step it
    resumes at (its own ``step``, the caller's ``given``, both when they agree; refused when
    neither says), its content fingerprint and the dataset's own state."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict() (got state={state!r})")
    rest = dict(state)
    version = rest.pop("version", None)
    if version is None and "step" in rest:
        raise ValueError(f"state has a 'step' but no 'version' (keys: {sorted(state)})")
    if version is not None and version != STATE_VERSION:
        raise ValueError(f"state version={version!r} is not {STATE_VERSION} (keys: {sorted(state)})")
    saved, content = rest.pop("step", None), rest.pop("content", None)
    if saved is None and given is None:
        raise ValueError(
            "the state has no 'step' (a bare {'datasets': [...]} token-balanced checkpoint): pass the "
            "step to resume at, load_state_dict(state, step=k) or iterate_from(k, state=state)"
        )
    if saved is None:
        return check_step(given), content, rest
    saved = check_int("state['step']", saved, low=0)
    if given is not None and check_step(given) != saved:
        raise ValueError(f"step={given} differs from the state's step={saved}")
    return saved, content, rest
