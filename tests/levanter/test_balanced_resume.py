"""Issue 18, item 5: a token-balanced mixture trained through ``python -m meshbatch.levanter.train_lm``
writes its state (the seed's JSON) into each Levanter checkpoint; a resume loads it (no replay,
said in the log) and trains on the same batches: its losses equal the unbroken run's. A checkpoint
without the state says so in one WARNING line and replays, with the same losses.
(.venv-levanter, jax 0.7.2; a tiny Llama, 6 steps, CPU.)"""

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_train_lm import EXAMPLES, _losses, _train_with_console

pytestmark = pytest.mark.train

CONFIG = """\
data:
  type: token_balanced_mixture
  tokenizer: byte_tokenizer
  configs:                             # Levanter's LMMixtureDatasetConfig fields, flat
    docs: {cache_dir: cache/docs, train_urls: [data/train.jsonl]}
    held: {cache_dir: cache/held, train_urls: [data/validation.jsonl]}
  shuffle: era
  era_length: 8
  eos_id: 256
  baseline: min
model: {type: llama, tokenizer: byte_tokenizer, seq_len: 64, hidden_dim: 32, intermediate_dim: 64,
        num_layers: 1, num_heads: 2, num_kv_heads: 2, gradient_checkpointing: false}
trainer:
  seed: 0
  id: balanced-tiny
  tracker: {type: json_logger}
  require_accelerator: false
  ray: {auto_start_cluster: false}
  mp: p=f32,c=f32
  train_batch_size: 8
  num_train_steps: 6
  steps_per_eval: 1000
  log_dir: logs/
  checkpointer: {base_path: checkpoints/, save_interval: 10000m, keep: [{every: 3}]}
optimizer: {learning_rate: 1e-2, weight_decay: 0.0, warmup: 0.0, lr_schedule: constant}
"""


def _run(root: pathlib.Path) -> tuple[dict[int, float], str]:
    metrics, console = _train_with_console(root, "balanced.yaml")
    return _losses(metrics), console  # the console: each log line once


def test_balanced_state_is_checkpointed_and_restored(tmp_path):
    shutil.copy(EXAMPLES / "prepare.py", tmp_path / "prepare.py")
    subprocess.run([sys.executable, "prepare.py"], cwd=tmp_path, check=True)
    (tmp_path / "balanced.yaml").write_text(CONFIG)
    losses, _ = _run(tmp_path)
    assert sorted(losses) == list(range(6)), sorted(losses)
    checkpoints = tmp_path / "checkpoints" / "balanced-tiny"
    saved = json.loads((checkpoints / "step-3" / "meshbatch_data_state.json").read_text())
    assert saved["step"] == 4 and [e["spec"] for e in saved["datasets"]] == ["docs", "held"]
    assert sum(e["row_offset"] for e in saved["datasets"]) == 4 * 8  # rows of steps 0..3
    for later in checkpoints.iterdir():
        if later.name != "step-3":
            shutil.rmtree(later)
    resumed, log = _run(tmp_path)
    assert sorted(resumed) == [4, 5], sorted(resumed)
    assert "restored the data state of step 4" in log and "no meshbatch_data_state.json" not in log
    for step in resumed:
        np.testing.assert_allclose(resumed[step], losses[step], rtol=1e-5, err_msg=f"step {step}")
    for later in checkpoints.iterdir():
        if later.name != "step-3":
            shutil.rmtree(later)
    (checkpoints / "step-3" / "meshbatch_data_state.json").unlink()  # an older checkpoint
    replayed, log = _run(tmp_path)
    missing = [line for line in log.splitlines() if "no meshbatch_data_state.json for step 4" in line]
    assert len(missing) == 1 and "WARNING" not in missing[0], log[-3000:]
    assert "replaying the TokenBalancedMixture's plans of steps 0..3" in missing[0]
    replay = [line for line in log.splitlines() if "to rebuild the state of step 4" in line]
    assert len(replay) == 1 and "WARNING" in replay[0] and "planning steps " in replay[0], log[-3000:]
    for step in replayed:
        np.testing.assert_allclose(replayed[step], losses[step], rtol=1e-5, err_msg=f"step {step}")
