"""Issue 34, must-show 1, 2 and 5: a Levanter run switched to meshbatch mid-way continues the same
run, and the log says what ran.

For a single source with ``shuffle: true`` and for a shuffled mixture (a component at weight 0
between two others), four ``train_lm`` runs of a tiny Llama, 6 steps, a checkpoint at step 3:

* ``ours``: ``python -m meshbatch.levanter.train_lm`` on the block with ``type:`` added;
* ``theirs``: Levanter's own ``python -m levanter.main.train_lm`` on the block as it is: its
  losses equal ``ours`` bit for bit (Levanter's order is the default), and its checkpoint holds no
  data-order record;
* ``theirs -> ours``: ``theirs``' step-3 checkpoint resumed with ``type:`` added (for the single
  source: Levanter's config as it is, its ``data:`` an ``!include``d shared file, and
  ``--data.type causal_lm`` on the command line): the losses of the steps after it equal the
  uninterrupted run's;
* ``ours -> theirs``: ``ours``' step-3 checkpoint resumed by Levanter's own loader: the same.

Then ``ours``' checkpoint resumed under another order (``compat: strong``) is refused by name,
naming the line to add (the mixture's record against ``mixture_compat: exact`` in process).
``ours``' log and tracker summary name the order family per source and for the mixture, the
loader path and the cache state, and its data metrics appear from the first step of this short
run (``metrics_every`` at its default, 10). The caches are built by the first (meshbatch) run
in process; Levanter's own runs find them.
"""

import ast
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from run_logs import levanter_exit_abort, read_metrics

from meshbatch.cache import ByteTokenizer
from meshbatch.levanter.order import DataOrderMismatch, check

pytestmark = pytest.mark.train
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at".split()
STEPS, CHECKPOINT = 6, 3

SINGLE = """\
tokenizer: {root}/tok
cache_dir: {root}/cache/single
train_urls: [{root}/web.jsonl]
shuffle: true
"""
MIXTURE = """\
tokenizer: {root}/tok
cache_dir: {root}/cache/mixture
configs:
  web: {{train_urls: [{root}/web.jsonl]}}
  off: {{train_urls: [{root}/off.jsonl]}}
  code: {{train_urls: [{root}/code.jsonl]}}
train_weights: {{web: 0.6, off: 0.0, code: 0.4}}
mixture_block_size: 8
shuffle: true
"""
TRAIN = """\
model: {{type: llama, tokenizer: {root}/tok, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 1,
        num_heads: 2, num_kv_heads: 2, gradient_checkpointing: false}}
trainer:
  seed: 0
  id: run
  tracker: {{type: json_logger}}
  watch: {{interval: 0}}
  require_accelerator: false
  ray: {{auto_start_cluster: false}}
  mp: p=f32,c=f32
  train_batch_size: 4
  num_train_steps: {steps}
  steps_per_eval: 1000
  log_dir: {root}/logs/{label}
  checkpointer: {{base_path: {root}/ckpt/{label}, save_interval: 10000m, keep: [{{every: {every}}}]}}
optimizer: {{learning_rate: 1e-2, weight_decay: 0.0, warmup: 0.0, lr_schedule: constant}}
"""
OURS, THEIRS = "meshbatch.levanter.train_lm", "levanter.main.train_lm"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("resume")
    rng = np.random.default_rng(0)
    for name, docs in (("web", 40), ("off", 5), ("code", 30)):
        with open(root / f"{name}.jsonl", "w") as f:
            for _ in range(docs):
                f.write(
                    json.dumps({"text": f"{name}: " + " ".join(rng.choice(WORDS, int(rng.integers(10, 40))))})
                )
                f.write("\n")
    ByteTokenizer().save_pretrained(str(root / "tok"))
    return root


def run(root: pathlib.Path, label: str, entry: str, data: str, *args: str, check: bool = True, include=False):
    """One ``train_lm`` run: its metrics by step (``summary``: the tracker's summary) and log.
    ``include``: ``data:`` is ``!include``d from a shared file, as 26 of Levanter's configs do."""
    config = root / f"{label}.yaml"
    train = TRAIN.format(root=root, label=label, steps=STEPS, every=CHECKPOINT)
    if include:
        (root / "data").mkdir(exist_ok=True)
        (root / "data" / f"{label}.yaml").write_text(data.format(root=root))
        config.write_text(f"data: !include data/{label}.yaml\n" + train)
    else:
        body = "".join(f"  {line}\n" for line in data.format(root=root).splitlines())
        config.write_text("data:\n" + body + train)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    for name in ("XLA_FLAGS", "JAX_NUMPY_DTYPE_PROMOTION", "JAX_NUMPY_RANK_PROMOTION"):
        env.pop(name, None)  # conftest's test settings: the run is a user's, one CPU device
    command = [sys.executable, "-m", entry, "--config_path", str(config), *args]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    if not check:
        return done.returncode, output
    assert done.returncode == 0 or levanter_exit_abort(entry, done.returncode, output), output[-8000:]
    metrics = read_metrics(root / "logs" / label)
    return metrics, output


def losses(metrics) -> dict[int, float]:
    return {s: m["train/loss"] for s, m in metrics.items() if s != "summary" and "train/loss" in m}


def resume_from(root: pathlib.Path, source: str, label: str) -> None:
    """``source``'s checkpoint of step ``CHECKPOINT`` as the only one of run ``label`` (the same id)."""
    shutil.copytree(
        root / "ckpt" / source / "run" / f"step-{CHECKPOINT}",
        root / "ckpt" / label / "run" / f"step-{CHECKPOINT}",
    )


def switch_both_ways(root, name: str, block: str, kind: str, *, include: bool = False):
    """The four runs; returns ``ours``' metrics and log. ``include``: ``theirs -> ours`` is
    Levanter's config with its ``data:`` included, ``--data.type`` on the command line."""
    ours, log = run(root, f"{name}-ours", OURS, f"type: {kind}\n" + block)
    want = losses(ours)
    assert sorted(want) == list(range(STEPS)), sorted(want)
    saved = root / "ckpt" / f"{name}-ours" / "run" / f"step-{CHECKPOINT}" / "meshbatch_data_order.json"
    assert json.loads(saved.read_text())["order"]["sources"], saved.read_text()
    theirs, _ = run(root, f"{name}-theirs", THEIRS, block)
    assert losses(theirs) == want  # Levanter's own loader: bit for bit the same batches
    assert not (
        root / "ckpt" / f"{name}-theirs" / "run" / f"step-{CHECKPOINT}" / "meshbatch_data_order.json"
    ).exists()
    resume_from(root, f"{name}-theirs", f"{name}-to-ours")
    if include:  # Levanter's config, its data: block included and unedited; the type on the command line
        switched, switched_log = run(root, f"{name}-to-ours", OURS, block, "--data.type", kind, include=True)
        assert f"meshbatch: data type={kind} order=" in switched_log
    else:
        switched, switched_log = run(root, f"{name}-to-ours", OURS, f"type: {kind}\n" + block)
    after = losses(switched)
    assert sorted(after) == list(range(CHECKPOINT + 1, STEPS)), sorted(after)
    # the resumed run finds the caches the first run built: its start line says so per source
    line = next(line for line in switched_log.splitlines() if f"meshbatch: data type={kind} order=" in line)
    caches = ast.literal_eval(re.search(r" caches=(\{.*?\})(?: content_fingerprint=|$)", line).group(1))
    assert caches and all(state.startswith("found (") for state in caches.values()), line
    assert after == {s: want[s] for s in after}
    assert "written by Levanter's own loader): resuming in Levanter's order" in switched_log
    resume_from(root, f"{name}-ours", f"{name}-to-theirs")
    back, _ = run(root, f"{name}-to-theirs", THEIRS, block)
    assert losses(back) == {s: want[s] for s in losses(back)} and max(losses(back)) == STEPS - 1
    return ours, log


def refused(root, name: str, block: str, kind: str, extra: str) -> str:
    resume_from(root, f"{name}-ours", f"{name}-other")
    code, output = run(root, f"{name}-other", OURS, f"type: {kind}\n" + block + extra, check=False)
    assert code != 0 and "DataOrderMismatch" in output, output[-6000:]
    return output


def test_a_single_shuffled_source_switches_both_ways_and_says_what_ran(root):
    ours, log = switch_both_ways(root, "single", SINGLE, "causal_lm", include=True)
    # must-show 5: the start line and the tracker's summary
    line = next(line for line in log.splitlines() if "meshbatch: data type=causal_lm" in line)
    assert 'order=levanter {"shuffle": true, "permutation_type": "linear", "compat": "levanter"}' in line, (
        line
    )
    assert "loader=fast path (meshbatch.Pipeline" in line and "cache_builder=in_process" in line, line
    assert "caches={'': 'built (" in line, line  # this run built it
    summary = ours["summary"]
    assert summary["meshbatch/loader"] == "fast path" and summary["meshbatch/fast_path"] is True
    assert summary["meshbatch/order/default"].startswith("levanter {"), summary
    assert summary["meshbatch/cache/default"].startswith("built"), summary
    assert (
        ours[0]["data/meshbatch/default/rows"] >= 4 and "data/meshbatch/wait_p50_s" in ours[0]
    )  # the first step
    # must-show 2: another order than the checkpoint's is refused, naming the line to add
    output = refused(root, "single", SINGLE, "causal_lm", "compat: strong\n")
    assert (
        "trained in another data order than this run's: compat: checkpoint levanter, this run strong"
        in output
    )
    assert "To continue its order, set under data: compat: levanter" in output


@pytest.mark.slow  # four runs of a three-component mixture
def test_a_shuffled_mixture_switches_both_ways_and_says_what_ran(root):
    ours, log = switch_both_ways(root, "mixture", MIXTURE, "stable_mixture")
    line = next(line for line in log.splitlines() if "meshbatch: data type=stable_mixture" in line)
    assert "order=mixture=levanter (block 8, restart, 2 components) sources: web=levanter {" in line, line
    assert "; code=levanter {" in line and "loader=fast path" in line, line
    summary = ours["summary"]
    assert summary["meshbatch/mixture_order"] == "levanter"
    assert {f"meshbatch/{what}/{name}" for what in ("order", "cache") for name in ("web", "code")} <= set(
        summary
    )
    # the mixture's refusal (mixture_compat: exact) without a sixth run: its checkpoint's record
    # against the record such a run makes (tests/levanter/test_levanter_order.py checks the message)
    saved = root / "ckpt" / "mixture-ours" / "run" / f"step-{CHECKPOINT}" / "meshbatch_data_order.json"
    recorded = json.loads(saved.read_text())["order"]
    assert recorded["mixture_compat"] == "levanter" and recorded["components"] == ["web", "code"]
    with pytest.raises(DataOrderMismatch, match="set under data: mixture_compat: levanter"):
        check(recorded, {**recorded, "mixture_compat": "exact"}, str(saved.parent))
