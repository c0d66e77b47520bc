"""The fast path: Levanter's training loop fed global batches straight from ``meshbatch.Pipeline``.

Levanter's ``DataLoader`` asks a dataset for per-example ``LmExample``s, stacks them on the host
and places them on the mesh. ``PipelineLoader`` has the ``DataLoader``'s interface
(``iter_from_step``, ``__iter__``) and yields batched ``LmExample``s whose arrays are the
``Pipeline``'s globally sharded ones: plan, coalesced reads and build per shard on the devices,
no per-example objects, no host stacking. A ``MeshbatchDataset``'s row ``g`` is the pipeline's
stream position ``g``, so the batches equal the ``DataLoader``'s bit for bit (tested), the last
one of a finite stream (``epochs``) included: padded with zero rows, as the ``DataLoader`` pads it
(``pad_final_batch``, ``meshbatch.pipeline.pipeline``).

``fast_path()`` makes ``Trainer.data_loader`` return one for a ``MeshbatchDataset`` (the entry
point ``meshbatch.levanter.train_lm`` runs inside it); any other dataset gets Levanter's loader.

Early start: Levanter's ``train_lm`` makes the train set, then the model (``Trainer.initial_state``:
its init compiles), then the loader, and asks for step 0. Within ``fast_path()``, the train set a
meshbatch config made (``note``, from its ``announce``) gets its ``PipelineLoader`` made
in a thread while ``initial_state`` runs, and, when the trainer has no checkpoint to resume from,
its stream from step 0 started there too (its programs compile and its first batches are read
beside the model's init); ``data_loader`` then hands that loader over and ``iter_from_step(0)``
that stream. A resumed run gets the early loader and a stream from its own step.

Data state in checkpoints: Levanter's checkpoint holds the model, optimizer and step, not the
data: a ``TokenBalancedMixture`` resumed at step ``k`` would have to replay every plan from step 0
to rebuild its counts. Within ``saved_with_checkpoints()`` (``fast_path()`` enters it), each
``Checkpointer.save_checkpoint`` also writes the training pipeline's ``state_dict()`` as
``meshbatch_data_state.json`` in the checkpoint's own directory (process 0; it is deleted with the
checkpoint), and on resume ``restore`` finds the file whose ``step`` is the trainer's and loads
it: no replay::

    checkpoints/run/step-100/{metadata.json, ..., meshbatch_data_state.json}
    meshbatch_data_state.json = {"version": 1, "step": 101, "datasets": [{"spec": "web", ...}, ...]}
    resume at trainer step 101 -> pipeline.load_state_dict(that file) -> plans step 101 only

A checkpoint without the file (saved without meshbatch's data state) is said so in an INFO line;
the plans are then replayed from step 0, which the pipeline says in its one WARNING line, with the
planner's progress lines.

Every checkpoint also records the train set's data order (``order.py``) and its content
fingerprint (``Pipeline.content_fingerprint()``) as ``meshbatch_data_order.json``, any dataset,
stateful or not; a resume checks both (``fast_path()``'s ``initial_state``)::

    meshbatch_data_order.json = {"version": 2, "step": 101, "order": {...},
                                 "content_fingerprint": "3f9c..."}
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import weakref
from collections.abc import Iterator

import fsspec
import haliax as hax
import jax
from levanter.checkpoint import Checkpointer, discover_latest_checkpoint
from levanter.layers.attention import AttentionMask
from levanter.models.lm_model import LmExample
from levanter.trainer import Trainer

from meshbatch.kernels import Batch
from meshbatch.pipeline.pipeline import Pipeline

from . import order
from .async_datasets import MeshbatchDataset

logger = logging.getLogger(__name__)
SAID = (__name__, "meshbatch.pipeline.state_planner")  # loggers whose INFO lines reach Levanter's log
STATE_FILE = "meshbatch_data_state.json"


def batched_lm_example(batch: Batch, Batch_: hax.Axis, Pos: hax.Axis) -> LmExample:
    """A global ``Batch`` as one batched ``LmExample`` (what ``DataLoader`` stacks from examples)."""
    axes = (Batch_, Pos)
    return LmExample(
        tokens=hax.named(batch.tokens, axes),
        loss_mask=hax.named(batch.loss_mask, axes),
        attn_mask=AttentionMask.causal().with_segment_ids(hax.named(batch.segment_ids, axes)),
    )


class PipelineLoader:
    """``DataLoader``'s interface over a ``Pipeline`` of a ``MeshbatchDataset``'s dataset, key,
    epochs and ``Pos``, sharded over the mesh axes ``axis_mapping`` (haliax's compute mapping)
    gives ``batch_axis``; ``batch_size`` is Levanter's ``train_batch_size`` (an int or its
    schedule). A stateful dataset's state is read back from ``checkpoint_path``
    (``Trainer.checkpoint_path``; ``restore``). ``pad_final_batch``: with ``dataset.epochs`` set,
    the final partial batch padded with zero rows (loss mask 0), as Levanter's ``DataLoader`` by
    default; ``False`` drops it, as ``DataLoader(pad_final_batch=False)``.
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
        self._started = None  # (step, stream) of start(step)
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
        started, self._started = self._started, None
        if started is not None and started[0] == start:
            stream = started[1]  # start(start) made it: its first batches are in the making
        else:
            if started is not None:
                started[1].close()
            restore(self.pipeline, start, self.checkpoint_path)
            stream = self.pipeline.iterate_from(start)
        return self._examples(stream, start)

    def start(self, step: int = 0) -> None:
        """Start making the batches from ``step`` now (the stream ``iter_from_step(step)`` then
        returns); another step's ``iter_from_step`` closes it and starts its own."""
        restore(self.pipeline, step, self.checkpoint_path)
        self._started = (step, self.pipeline.iterate_from(step))

    def _examples(self, stream, start: int) -> Iterator[LmExample]:
        metrics = getattr(self.dataset, "metrics", None)  # observe.StepMetrics, set by a data config
        at = start - 1
        with stream:  # closed when the trainer drops the loop
            for at, batch in enumerate(stream, start):
                Batch_ = hax.Axis(self.batch_axis, batch.tokens.shape[0])
                yield batched_lm_example(batch, Batch_, self.dataset.Pos)
                if metrics is not None:
                    metrics.after(at, self.pipeline, first=at == start)
        logger.info(  # a finite stream ran out: the trainer stops here, whatever num_train_steps says
            "meshbatch: the data ends after %s epoch(s) (epoch: %s): step %d was the last step with data, so "
            "training stops there, as Levanter's loader stops it",
            self.dataset.epochs, self.dataset.epochs, at,
        )  # fmt: skip

    def __iter__(self) -> Iterator[LmExample]:
        return self.iter_from_step(0)


@contextlib.contextmanager
def fast_path():
    """Within it, ``Trainer.data_loader(dataset)`` of a ``MeshbatchDataset`` (``fast_path=True``, its
    default) is a ``PipelineLoader``; the training loader's (``batch`` not given, as ``train_lm``
    asks) state goes into each checkpoint (``saved_with_checkpoints``)."""
    original, original_initial_state = Trainer.data_loader, Trainer.initial_state

    def make_loader(self, dataset, batch=None) -> PipelineLoader:
        return PipelineLoader(
            dataset,
            mesh=self.device_mesh,
            axis_mapping=self.compute_axis_mapping,
            batch_size=batch.size if batch is not None else self.config.train_batch_size,
            batch_axis=batch.name if batch is not None else self.config.batch_axis,
            checkpoint_path=self.checkpoint_path,
        )

    def initial_state(self, *args, **kwargs):
        dataset = None if _Noted.train is None else _Noted.train()
        say, _Noted.train, _Noted.start = _Noted.start, None, None
        if say is not None:  # Levanter's log and tracker are set up by now
            say()
        if isinstance(dataset, MeshbatchDataset) and dataset.fast_path:
            early = _Early(dataset, lambda: make_loader(self, dataset), resume=self.checkpoint_path)
            self._meshbatch_early = early
        state = original_initial_state(self, *args, **kwargs)
        record, step = _Noted.record, int(state.step)
        if record is not None and step > 0:  # resumed: in the checkpoint's data order?
            # none: a checkpoint of Levanter's own loader (or of meshbatch before order records)
            path, file = _find(self.checkpoint_path, order.ORDER_FILE, step) or (None, {})
            where = f"{self.checkpoint_path} (step {step})" if path is None else os.path.dirname(path)
            order.check(file.get("order"), record, where, version=file.get("version", order.ORDER_VERSION))
            fingerprint = file.get("content_fingerprint")
            order.check_content(fingerprint, _Noted.fingerprint, where)  # a WARNING if it differs
        return state

    def data_loader(self, dataset, batch=None):
        if not (isinstance(dataset, MeshbatchDataset) and dataset.fast_path):
            return original(self, dataset, batch)
        early = getattr(self, "_meshbatch_early", None)
        loader = None
        if batch is None and early is not None and early.dataset is dataset:
            self._meshbatch_early = None
            loader = early.result()
        if loader is None:
            loader = make_loader(self, dataset, batch)
        if batch is None and loader.pipeline.dataset.init_state() is not None:
            _Noted.pipeline = loader.pipeline  # stateful: its state goes into the next checkpoints
        return loader

    Trainer.data_loader, Trainer.initial_state = data_loader, initial_state
    try:
        with saved_with_checkpoints():
            yield
    finally:
        Trainer.data_loader, Trainer.initial_state = original, original_initial_state
        _Noted.start = None  # not said: no trainer started


class _Noted:
    """What the data config made last in this process left for the trainer (``note``), and the
    pipeline it trains from."""

    record: dict | None = None  # the train set's order: what the checkpoints record, a resume checks
    fingerprint: str | None = None  # its content fingerprint (Pipeline.content_fingerprint())
    train: weakref.ref | None = None  # a meshbatch config's train set: its loader made early
    start = None  # a Levanter config's start line, said once its log and tracker are set up
    pipeline: Pipeline | None = None  # the stateful pipeline the trainer trains from, if any (data_loader)


def note(record: dict | None, fingerprint: str | None = None, *, train=None, start=None) -> None:
    """The train set's order ``record`` and content ``fingerprint`` (what the next checkpoints
    record and a resume is checked against); within ``fast_path()`` the next
    ``Trainer.initial_state`` makes the loader of ``train`` (a ``MeshbatchDataset``; and starts its
    stream) beside the model's init, and says ``start()``: ``train_lm`` reads a Levanter config
    before Levanter sets up its log and tracker, which would drop a line said then."""
    _Noted.record = None if record is None else order.normal(record)
    _Noted.fingerprint = None if record is None else fingerprint
    _Noted.train = None if train is None else weakref.ref(train)
    _Noted.start = start


class _Early:
    """A ``PipelineLoader`` made in a thread (and its stream from step 0 started there when no
    checkpoint under ``resume`` says the run resumes); ``result()`` joins it: the loader, or
    ``None`` (the reason logged) for the trainer to make one itself."""

    def __init__(self, dataset: MeshbatchDataset, make, *, resume: str | None):
        self.dataset, self._loader, self._error = dataset, None, None
        self._thread = threading.Thread(
            target=self._run, args=(make, resume), name="meshbatch-early", daemon=True
        )
        self._thread.start()

    def _run(self, make, resume) -> None:
        try:
            loader = make()
            if resume is None or discover_latest_checkpoint(resume) is None:
                loader.start(0)
            self._loader = loader
        except Exception as e:  # the trainer makes its own loader, which raises it there
            self._error = e

    def result(self) -> PipelineLoader | None:
        self._thread.join()
        if self._error is not None:
            logger.warning("meshbatch: the early loader failed (%r); making it again", self._error)
        return self._loader


@contextlib.contextmanager
def saved_with_checkpoints():
    """Within it, Levanter's ``Checkpointer.save_checkpoint`` also writes the tracked pipeline's
    state into the checkpoint's directory (for the trainer's ``state.step``, the next step); the
    restore line and a replay's progress lines are logged at INFO (``SAID``) meanwhile."""
    original = Checkpointer.save_checkpoint
    levels = {name: logging.getLogger(name).level for name in SAID}
    for name in SAID:
        if not logging.getLogger(name).isEnabledFor(logging.INFO):
            logging.getLogger(name).setLevel(logging.INFO)

    def save_checkpoint(self, info, destination, commit_callback=None, *, is_temporary=False):
        original(self, info, destination, commit_callback, is_temporary=is_temporary)
        write_data(os.path.join(self.base_path, destination), int(info.state.step))

    Checkpointer.save_checkpoint = save_checkpoint
    try:
        yield
    finally:
        Checkpointer.save_checkpoint = original
        _Noted.pipeline = None
        note(None)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _write_json(path: str, value: dict) -> None:
    if jax.process_index() == 0:
        fs, plain = fsspec.core.url_to_fs(path)
        fs.makedirs(os.path.dirname(plain), exist_ok=True)
        with fs.open(plain, "w") as out:
            json.dump(value, out)


def write_data(directory: str, step: int) -> None:
    """Write into the checkpoint ``directory`` the tracked pipeline's state at the start of ``step``
    (none when nothing is tracked or, never expected, the pipeline is at another step) and the
    train set's data order and content fingerprint (none when no order was noted)."""
    pipeline = _Noted.pipeline
    state = None if pipeline is None else pipeline.state_dict()
    if state is not None and state["step"] != step:
        logger.warning(
            "not saving the data state in %s: the pipeline is at step %d, the checkpoint at step %d",
            directory, state["step"], step,
        )  # fmt: skip
    elif state is not None:
        _write_json(os.path.join(directory, STATE_FILE), state)
    if _Noted.record is not None:
        saved = {"version": order.ORDER_VERSION, "step": step, "order": _Noted.record}
        if _Noted.fingerprint is not None:
            saved["content_fingerprint"] = _Noted.fingerprint
        _write_json(os.path.join(directory, order.ORDER_FILE), saved)


def _find(checkpoint_path: str, name: str, step: int) -> tuple[str, dict] | None:
    fs, root = fsspec.core.url_to_fs(checkpoint_path)
    for path in [os.path.join(root, name), *sorted(fs.glob(os.path.join(root, "*", name)))]:
        if fs.exists(path):
            with fs.open(path) as f:
                saved = json.load(f)
            if saved.get("step") == step:
                return path, saved
    return None


def restore(pipeline: Pipeline, step: int, checkpoint_path: str | None) -> bool:
    """Load ``pipeline``'s state at ``step`` from the checkpoint; ``False`` when it holds none
    (an INFO line naming what is missing): the pipeline then replays its plans from step 0, and
    says so in its one WARNING line when the stream starts. Stateless: ``True``."""
    if step == 0 or pipeline.dataset.init_state() is None:
        return True
    # the saved state of ``step`` in a checkpoint or the folder of a run's checkpoints (as
    # Levanter's load_checkpoint_path)
    found = None if checkpoint_path is None else _find(checkpoint_path, STATE_FILE, step)
    if found is None:
        logger.info(
            "no %s for step %d under %s (a checkpoint saved without meshbatch's data state): "
            "replaying the %s's plans of steps 0..%d to rebuild its state",
            STATE_FILE, step, checkpoint_path, type(pipeline.dataset).__name__, step - 1,
        )  # fmt: skip
        return False
    path, state = found
    pipeline.load_state_dict(state)
    logger.info("restored the data state of step %d from %s (no replay)", step, path)
    return True
