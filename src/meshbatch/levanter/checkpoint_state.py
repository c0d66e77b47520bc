"""A stateful dataset's state (a token-balanced mixture's counts) in Levanter's checkpoints.

Levanter's checkpoint holds the model, optimizer and step, not the data: a ``TokenBalancedMixture``
resumed at step ``k`` would have to replay every plan from step 0 to rebuild its counts. Within
``saved_with_checkpoints()`` (``fast_path()`` enters it), each ``Checkpointer.save_checkpoint``
also writes the training pipeline's ``state_dict()`` as ``meshbatch_data_state.json`` in the
checkpoint's own directory (process 0; it is deleted with the checkpoint), and on resume
``restore`` finds the file whose ``step`` is the trainer's and loads it: no replay::

    checkpoints/run/step-100/{metadata.json, ..., meshbatch_data_state.json}
    meshbatch_data_state.json = {"version": 1, "step": 101, "datasets": [{"spec": "web", ...}, ...]}
    resume at trainer step 101 -> pipeline.load_state_dict(that file) -> plans step 101 only

A checkpoint without the file (saved without meshbatch's data state) is said so in an INFO line;
the plans are then replayed from step 0, which the pipeline says in its one WARNING line, with the
planner's progress lines.

Every checkpoint also records the train set's data order (``order.py``) and its content
fingerprint (``Pipeline.content_fingerprint()``) as ``meshbatch_data_order.json``, any dataset,
stateful or not; a resume checks both (``fast.py``)::

    meshbatch_data_order.json = {"version": 2, "step": 101, "order": {...},
                                 "content_fingerprint": "3f9c..."}
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import fsspec
import jax
from levanter.checkpoint import Checkpointer

from meshbatch.pipeline.pipeline import Pipeline

from . import order

logger = logging.getLogger(__name__)
SAID = (__name__, "meshbatch.pipeline.state_planner")  # loggers whose INFO lines reach Levanter's log
STATE_FILE = "meshbatch_data_state.json"


class _Training:
    pipeline: Pipeline | None = None  # the stateful pipeline the trainer trains from, if any


def track(pipeline: Pipeline) -> None:
    """Make ``pipeline`` the one whose state the next checkpoints hold (stateful datasets only)."""
    if pipeline.dataset.init_state() is not None:
        _Training.pipeline = pipeline


def write_state(directory: str, step: int) -> str | None:
    """Write the tracked pipeline's state at the start of ``step`` into ``directory``; the path,
    or ``None`` when nothing is tracked or (never expected) the pipeline is at another step."""
    pipeline = _Training.pipeline
    if pipeline is None:
        return None
    state = pipeline.state_dict()
    if state["step"] != step:
        logger.warning(
            "not saving the data state in %s: the pipeline is at step %d, the checkpoint at step %d",
            directory, state["step"], step,
        )  # fmt: skip
        return None
    path = os.path.join(directory, STATE_FILE)
    _write_json(path, state)
    return path


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
        write_state(os.path.join(self.base_path, destination), int(info.state.step))
        write_order(os.path.join(self.base_path, destination), int(info.state.step))

    Checkpointer.save_checkpoint = save_checkpoint
    try:
        yield
    finally:
        Checkpointer.save_checkpoint = original
        _Training.pipeline = None
        order.note(None)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _write_json(path: str, value: dict) -> None:
    if jax.process_index() == 0:
        fs, plain = fsspec.core.url_to_fs(path)
        fs.makedirs(os.path.dirname(plain), exist_ok=True)
        with fs.open(plain, "w") as out:
            json.dump(value, out)


def write_order(directory: str, step: int) -> str | None:
    """Write the train set's data order (``order.noted()``) and content fingerprint into the
    checkpoint ``directory`` as ``meshbatch_data_order.json``; the path, or ``None`` when no order
    was noted."""
    record = order.noted()
    if record is None:
        return None
    path = os.path.join(directory, order.ORDER_FILE)
    saved = {"version": order.ORDER_VERSION, "step": step, "order": record}
    if order.noted_fingerprint() is not None:
        saved["content_fingerprint"] = order.noted_fingerprint()
    _write_json(path, saved)
    return path


def _find(checkpoint_path: str, name: str, step: int) -> tuple[str, dict] | None:
    fs, root = fsspec.core.url_to_fs(checkpoint_path)
    for path in [os.path.join(root, name), *sorted(fs.glob(os.path.join(root, "*", name)))]:
        if fs.exists(path):
            with fs.open(path) as f:
                saved = json.load(f)
            if saved.get("step") == step:
                return path, saved
    return None


def find_order(checkpoint_path: str, step: int) -> tuple[dict | None, str]:
    """The data order recorded with the checkpoint of ``step`` under ``checkpoint_path`` (``None``
    when it has none: written by Levanter's own loader), and where it was looked for."""
    record, where, _ = find_record(checkpoint_path, step)
    return record, where


def find_record(checkpoint_path: str, step: int) -> tuple[dict | None, str, dict]:
    """``find_order``'s order and place, and the file's other entries (``version``,
    ``content_fingerprint``; empty when there is no file)."""
    found = _find(checkpoint_path, order.ORDER_FILE, step)
    if found is None:
        return None, f"{checkpoint_path} (step {step})", {}
    path, saved = found
    return saved["order"], os.path.dirname(path), saved


def find_state(checkpoint_path: str, step: int) -> tuple[str, dict] | None:
    """The saved data state whose ``step`` is ``step`` in ``checkpoint_path`` (a checkpoint or the
    folder of a run's checkpoints, as Levanter's ``load_checkpoint_path``), or ``None``."""
    return _find(checkpoint_path, STATE_FILE, step)


def restore(pipeline: Pipeline, step: int, checkpoint_path: str | None) -> bool:
    """Load ``pipeline``'s state at ``step`` from the checkpoint; ``False`` when it holds none
    (an INFO line naming what is missing): the pipeline then replays its plans from step 0, and
    says so in its one WARNING line when the stream starts. Stateless: ``True``."""
    if step == 0 or pipeline.dataset.init_state() is None:
        return True
    found = None if checkpoint_path is None else find_state(checkpoint_path, step)
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


__all__ = [
    "STATE_FILE",
    "find_order",
    "find_record",
    "find_state",
    "restore",
    "saved_with_checkpoints",
    "track",
    "write_order",
    "write_state",
]
