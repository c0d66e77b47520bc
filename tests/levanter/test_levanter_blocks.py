"""Must-show 1 and 2 of issue 18: Levanter's own ``data:`` blocks (tests/data/levanter/, copied
from Levanter's config/data with local paths) train through ``python -m
meshbatch.levanter.train_lm`` after adding only a ``type:`` line, offline: the tokenizers are hub
*names* (``gpt2``, ``EleutherAI/gpt-neox-20b``) served from a Hugging Face cache this test writes
(a byte tokenizer under ``HF_HOME/hub/models--<name>/snapshots/<hash>/``, ``HF_HUB_OFFLINE=1``).
With Levanter's order (the default, for the single source and the mixture) the training losses
equal those of Levanter's own loader (the same block without ``type:``, run by the same entry
point) bit for bit over 32 steps.
"""

import gzip
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import zstandard
from levanter.store.cache import SerialCacheWriter
from run_logs import read_metrics

from meshbatch.cache import ByteTokenizer

pytestmark = pytest.mark.train
BLOCKS = pathlib.Path(__file__).parents[1] / "data" / "levanter"
PREFETCH_BOUND = 8  # steps the pipeline may have read ahead of the trainer
PIPELINE_STATS = (  # Pipeline.stats()'s keys, each logged as data/meshbatch/<key> (docs/levanter.md)
    "batches wait_total_s wait_p50_s wait_p95_s wait_p99_s wait_max_s wait_mean_s step_p50_s stall_fraction "
    "ready_mean ready_min depth make_p50_s make_p95_s make_p99_s make_max_s make_mean_s read_batches "
    "read_p50_s read_p99_s read_max_s read_mean_s examples_made requests_per_example bytes_per_example"
).split()
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at".split()

TRAIN = """\
model:
  type: llama
  tokenizer: {tokenizer}
  seq_len: 32
  hidden_dim: 32
  intermediate_dim: 64
  num_layers: 1
  num_heads: 2
  num_kv_heads: 2
  gradient_checkpointing: false
trainer:
  seed: 0
  id: {run}
  tracker: {{type: json_logger}}
  watch: {{interval: 0}}  # no per-parameter norms: a second train step to compile (test_train_lm.py)
  require_accelerator: false
  ray: {{auto_start_cluster: false}}
  mp: p=f32,c=f32
  train_batch_size: 4
  num_train_steps: {steps}
  steps_per_eval: {eval_every}
  max_eval_batches: 1
  per_device_eval_parallelism: 4
  log_dir: {root}/logs/{run}
  checkpointer: {{base_path: {root}/checkpoints/{run}, save_interval: 10000m}}
optimizer: {{learning_rate: 1e-2, weight_decay: 0.0, warmup: 0.0, lr_schedule: constant}}
"""


def _text(rng, n: int) -> str:
    return " ".join(rng.choice(WORDS, n))


def _hub_tokenizer(hf_home: pathlib.Path, name: str) -> None:
    """A byte tokenizer served as the hub's ``name`` from the local Hugging Face cache."""
    repo = hf_home / "hub" / ("models--" + name.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    ByteTokenizer().save_pretrained(str(snapshot))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text("0" * 40)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("blocks")
    rng = np.random.default_rng(0)
    for name in ("gpt2", "EleutherAI/gpt-neox-20b"):
        _hub_tokenizer(root / "hf", name)
    owt = root / "openwebtext-sharded"
    owt.mkdir()
    for split, shards in (("train", 4), ("val", 2)):
        for i in range(1, shards + 1):
            with gzip.open(owt / f"openwebtext_{split}.{i}-of-{shards}.jsonl.gz", "wt") as f:
                for _ in range(30 if split == "train" else 8):
                    f.write(json.dumps({"text": _text(rng, int(rng.integers(10, 60)))}) + "\n")
    pile = (BLOCKS / "pile_mixture.yaml").read_text()
    lines = pile.split("configs:")[1].split("train_weights:")[0].splitlines()
    for name in [line.strip()[:-1] for line in lines if line.startswith("  ") and not line.startswith("   ")]:
        component = root / "pile-domains" / name
        component.mkdir(parents=True)
        for file, docs in (("train-00", 6), ("train-01", 6), ("val", 3)):
            lines = "".join(json.dumps({"text": f"{name}: " + _text(rng, 30)}) + "\n" for _ in range(docs))
            (component / f"{file}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    pre = root / "tokenized" / "pretokenized"
    # Pre-tokenized with Levanter's writer; train only: Levanter 1.2.dev1644's evaluator computes
    # bits per byte by tokenizing text, which its passthrough tokenizer cannot (with Levanter's own
    # loader too), so a passthrough validation set cannot be evaluated.
    with SerialCacheWriter(str(pre / "train"), {"input_ids": np.zeros(0, np.int32)}) as writer:
        writer.write_batch([{"input_ids": rng.integers(0, 257, 50).astype(np.int32)} for _ in range(40)])
    (root / "supervised").mkdir()
    for split, docs in (("train", 60), ("val", 8)):
        with gzip.open(root / "supervised" / f"{split}.jsonl.gz", "wt") as f:
            for _ in range(docs):
                f.write(json.dumps({"prompt": _text(rng, 5) + "?", "response": _text(rng, 8)}) + "\n")
    return root


def _train(root: pathlib.Path, block: str, data: str, run: str, steps: int, tokenizer: str, eval_every: int):
    text = (BLOCKS / block).read_text().replace("{root}", str(root))
    config = root / f"{run}.yaml"
    body = "".join(f"  {line}\n" for line in (data + text).splitlines())
    config.write_text("data:\n" + body + TRAIN.format(root=root, run=run, steps=steps, tokenizer=tokenizer,
                                                        eval_every=eval_every))  # fmt: skip
    env = dict(os.environ, HF_HOME=str(root / "hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for name in ("XLA_FLAGS", "JAX_NUMPY_DTYPE_PROMOTION", "JAX_NUMPY_RANK_PROMOTION"):
        env.pop(name, None)  # conftest's test settings: the run is a user's, one CPU device
    command = [sys.executable, "-m", "meshbatch.levanter.train_lm", "--config_path", str(config)]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    metrics = read_metrics(root / "logs" / run)
    return metrics, "\n".join(p.read_text() for p in (root / "logs" / run).rglob("*.log")) + done.stderr


def _losses(metrics) -> dict[int, float]:
    return {step: m["train/loss"] for step, m in metrics.items() if step != "summary" and "train/loss" in m}


def _evaluated(metrics) -> set[str]:
    return {k for m in metrics.values() for k in m if k.startswith("eval/") and k.endswith("/loss")}


def _check_pipeline_stats(m: dict, step: int) -> None:
    """Issue 20: every field of ``Pipeline.stats()`` reaches the tracker, over the steps since the
    last report (10; 9 at step 9, the first report being step 0's), with values that make sense
    (4 rows of 32 tokens a step)."""
    stats = {k.removeprefix("data/meshbatch/"): v for k, v in m.items() if k.startswith("data/meshbatch/")}
    assert set(PIPELINE_STATS) <= set(stats), sorted(set(PIPELINE_STATS) - set(stats))
    batches = 9 if step == 9 else 10
    assert stats["batches"] == batches, (step, stats)  # the window: stats are reset at each report
    waits = [stats[f"wait_{q}_s"] for q in ("p50", "p95", "p99", "max")]
    assert 0 <= waits[0] <= waits[1] <= waits[2] <= waits[3] <= stats["wait_total_s"], (step, stats)
    assert stats["wait_total_s"] == pytest.approx(batches * stats["wait_mean_s"])
    assert 0 <= stats["stall_fraction"] <= 1 and stats["step_p50_s"] > 0, (step, stats)
    assert 0 <= stats["ready_min"] <= stats["ready_mean"] <= stats["depth"], (step, stats)
    assert stats["depth"] >= 1, (step, stats)
    assert stats["examples_made"] > 0 and stats["examples_made"] % 4 == 0, (step, stats)  # whole steps
    assert 0 < stats["requests_per_example"] <= 1, (step, stats)  # coalesced: a read serves windows
    assert stats["bytes_per_example"] >= 32 * 4, (step, stats)  # a window of 32 int32 tokens at least
    assert stats["read_batches"] >= 1, (step, stats)
    assert 0 < stats["read_p50_s"] <= stats["read_p99_s"] <= stats["read_max_s"], (step, stats)
    assert 0 < stats["make_p50_s"] <= stats["make_p95_s"] <= stats["make_p99_s"] <= stats["make_max_s"]


def test_openwebtext_block_trains_with_type_and_equals_levanter(root):
    ours, log = _train(
        root, "openwebtext_source.yaml", "type: causal_lm\n", "owt-meshbatch", 32, "gpt2", 1000
    )
    assert 'meshbatch: data type=causal_lm order=cache order {"shuffle": false} loader=fast path' in log
    # Must-show 5: the json_logger output holds the start line's facts and, at the first step and
    # every 10 steps, the rows and tokens read per source, reads per example and the consumer's wait.
    summary = ours["summary"]
    assert (summary["meshbatch/type"], summary["meshbatch/order"], summary["meshbatch/fast_path"]) == (
        "causal_lm", 'cache order {"shuffle": false}', True)  # fmt: skip
    assert "data/meshbatch/default/rows" in ours[0]  # from the first step on
    assert summary["meshbatch/cache/default"].startswith("built")  # built by this run
    for step in (9, 19, 29):
        m = ours[step]
        rows = m["data/meshbatch/default/rows"]  # read so far, a few prefetched steps ahead at most
        assert 4 * (step + 1) <= rows <= 4 * (step + 1 + PREFETCH_BOUND), (step, m)
        assert m["data/meshbatch/default/tokens"] == 32 * m["data/meshbatch/default/rows"]
        assert 0 < m["data/meshbatch/reads_per_example"] <= 1
        _check_pipeline_stats(m, step)
    theirs, their_log = _train(root, "openwebtext_source.yaml", "", "owt-levanter", 32, "gpt2", 1000)
    # Levanter's own block through meshbatch's entry point: Levanter's DataLoader runs, and the
    # start line (said once the trainer starts) and the tracker's summary name it and why
    assert (
        'meshbatch: data type=UrlSingleDatasetLMConfig order=cache order {"shuffle": false} '
        "loader=Levanter's DataLoader (Levanter's own config (no meshbatch type: under data:)) "
        "cache_builder=Levanter's caches={}"
    ) in their_log, their_log[-6000:]
    summary = theirs["summary"]
    assert (summary["meshbatch/loader"], summary["meshbatch/fast_path"]) == ("Levanter's DataLoader", False)
    assert summary["meshbatch/loader_why"] == "Levanter's own config (no meshbatch type: under data:)"
    losses, want = _losses(ours), _losses(theirs)
    assert sorted(losses) == list(range(32)) and sorted(want) == list(range(32)), (
        sorted(losses),
        sorted(want),
    )
    assert losses == want  # bit for bit: the same batches through the same model
    assert _evaluated(ours) == _evaluated(theirs) != set()


@pytest.mark.slow  # two runs (type only; Levanter's own) over 22 components
def test_pile_mixture_block_trains_with_type_and_equals_levanter(root):
    """Issue 34: Levanter's mixture order is the default: ``type: stable_mixture`` alone trains
    on Levanter's batches (before, ``mixture_compat: levanter`` had to be added)."""
    ours, log = _train(root, "pile_mixture.yaml", "type: stable_mixture\n", "pile-type", 32, "gpt2", 16)
    assert "meshbatch: data type=stable_mixture" in log
    assert len([k for k in _evaluated(ours) if k.count("/") == 2]) >= 10  # an eval set per component
    theirs, _ = _train(root, "pile_mixture.yaml", "", "pile-levanter", 32, "gpt2", 16)
    losses, want = _losses(ours), _losses(theirs)
    assert sorted(losses) == list(range(32)) and losses == want
    assert _evaluated(ours) == _evaluated(theirs)


@pytest.mark.parametrize(("block", "tokenizer"), [("pretokenized_passthrough.yaml", "gpt2"),
                                                  ("supervised_source.yaml", "gpt2")])  # fmt: skip
def test_passthrough_and_supervised_blocks_train_with_type(root, block, tokenizer):
    metrics, log = _train(root, block, "type: causal_lm\n", block.split("_")[0], 3, tokenizer, 3)
    assert sorted(_losses(metrics)) == [0, 1, 2], sorted(metrics)
    assert all(np.isfinite(v) for v in _losses(metrics).values())
    if block.startswith("supervised"):
        assert _evaluated(metrics), "the validation set was not evaluated"
    # issue 36: a supervised format trains PackedDataset rows on the fast path too, and says so
    assert "loader=fast path" in log and metrics["summary"]["meshbatch/fast_path"] is True
