"""Levanter's train_lm through ``python -m meshbatch.levanter.train_lm`` on the example YAMLs, on
the demo's corpus, CPU, json_logger tracker (runs in .venv-levanter, jax 0.7.2).

The splice run (a tiny GPT-2 on one document) trains 150 steps with a checkpoint at step 100; a
second run with the same id, its later checkpoints removed, resumes from step 100, and its losses
from there on equal the first run's (same batches, same state: the constant learning rate makes
the schedule independent of where a run starts). Between the two, ``frame_losses.py`` runs the
seed's smoke test on the step-100 checkpoint: loss on frames it trained on against the same text
at placements it never saw. The causal run trains a tiny Llama on the block-shuffled windows.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples" / "levanter"
pytestmark = pytest.mark.train
NO_WATCH = ("--trainer.watch.interval", "0")  # see _train_with_console


def _prepare(tmp_path: pathlib.Path) -> pathlib.Path:
    for name in ("splice_tiny_gpt2.yaml", "causal_tiny_llama.yaml", "prepare.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    subprocess.run([sys.executable, "prepare.py"], cwd=tmp_path, check=True)
    return tmp_path


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    for name in ("XLA_FLAGS", "JAX_NUMPY_DTYPE_PROMOTION", "JAX_NUMPY_RANK_PROMOTION"):
        env.pop(name, None)  # conftest's test settings: the run is a user's, one CPU device
    return env


def _train(root: pathlib.Path, config: str, *args: str) -> dict[int, dict]:
    return _train_with_console(root, config, *args)[0]


def _train_with_console(root: pathlib.Path, config: str, *args: str) -> tuple[dict[int, dict], str]:
    """One ``train_lm`` run from ``root``: its logged metrics by step, and its console output.

    Levanter's watch hook (per-parameter norms every 10 steps, on by default) is turned off: it is
    a second train step to trace and compile, about 5 of a run's 25 CPU-seconds here, and no test
    reads its metrics."""
    command = [sys.executable, "-m", "meshbatch.levanter.train_lm", "--config_path", config, *args, *NO_WATCH]
    done = subprocess.run(command, cwd=root, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    metrics: dict[int, dict] = {}
    for log in (root / "logs").rglob("*.log"):
        for line in log.read_text().splitlines():
            if '"event": "log"' in line:
                record = json.loads(line.split(" :: ", 1)[1])
                metrics.setdefault(record.get("step"), {}).update(record["metrics"])
        log.unlink()  # the next run's log starts empty
    return metrics, done.stdout + done.stderr


def _losses(metrics: dict[int, dict]) -> dict[int, float]:
    return {step: m["train/loss"] for step, m in metrics.items() if "train/loss" in m}


def test_splice_run_trains_checkpoints_and_resumes(tmp_path):
    root = _prepare(tmp_path)
    first = _train(root, "splice_tiny_gpt2.yaml")
    losses = _losses(first)
    assert sorted(losses) == list(range(150)), sorted(losses)
    early, late = np.mean([losses[s] for s in range(5)]), np.mean([losses[s] for s in range(145, 150)])
    assert late < 0.5 * early, (early, late)
    assert any("eval/loss" in m for m in first.values()), "the validation grid was not evaluated"
    checkpoints = root / "checkpoints" / "splice-tiny"
    assert (checkpoints / "step-100").is_dir(), list(checkpoints.iterdir())
    # The seed's smoke test: GPT-2 has learned absolute positions, so text it trained on is
    # predicted better at the placements it saw than at placements it never saw (measured at this
    # checkpoint: 2.486 against 2.591 over 663 frames; a RoPE model with the seed's prefix
    # segments sees no absolute position and gives the same loss at both).
    probe = [sys.executable, str(pathlib.Path(__file__).with_name("frame_losses.py"))]
    done = subprocess.run(
        [*probe, "splice_tiny_gpt2.yaml", str(checkpoints / "step-100"), "100"],
        cwd=root, env=_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    placement = json.loads(done.stdout.strip().splitlines()[-1])
    assert placement["frames"] > 300 and placement["seen"] < 0.6 * early, placement
    assert placement["seen"] < placement["unseen"] - 0.05, placement
    for later in checkpoints.iterdir():
        if later.name != "step-100":
            shutil.rmtree(later)
    resumed = _losses(_train(root, "splice_tiny_gpt2.yaml"))
    assert min(resumed) in (100, 101) and max(resumed) == 149, sorted(resumed)
    for step in sorted(resumed):
        np.testing.assert_allclose(resumed[step], losses[step], rtol=1e-5, err_msg=f"step {step}")


def test_block_shuffled_causal_run_trains(tmp_path):
    root = _prepare(tmp_path)
    losses = _losses(_train(root, "causal_tiny_llama.yaml", "--trainer.num_train_steps", "50"))
    assert sorted(losses) == list(range(50)), sorted(losses)
    early, late = np.mean([losses[s] for s in range(5)]), np.mean([losses[s] for s in range(45, 50)])
    assert late < 0.7 * early, (early, late)
