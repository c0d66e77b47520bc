"""Levanter: loader-only throughput and a tiny training run, meshbatch against Levanter's loader.

Runs in the Levanter environment (``.venv-levanter``: levanter 1.2.dev1644 trains under jax 0.7.2
only), one CPU device, on one cache: the demo's corpus (``examples/levanter/prepare.py``) built
by meshbatch (Levanter's on-disk format), read by both sides.

Loader only, windows of ``seq_len`` tokens, shuffled, ``batch`` rows a step, ``steps`` steps
from a fresh iterator after a warm-up, every batch's arrays ready:

* Levanter: ``DataLoader`` over its ``CausalLmDataset(TokenSeqDataset(cache))`` shuffled by its
  ``PermutationDataset`` (``shuffle: true``, Feistel), as ``UrlSingleDatasetLMConfig`` makes it,
  in an ``EpochDataset`` (``train_lm``'s ``epoch``) so that it streams past the small corpus;
* meshbatch through Levanter's ``DataLoader``: ``MeshbatchDataset(CausalLMDataset(cache,
  shuffle=block))`` (per-example ``LmExample``s);
* meshbatch fast path: ``PipelineLoader`` of the same dataset (``Pipeline``, batched).

Training: ``python -m meshbatch.levanter.train_lm`` on ``examples/levanter/causal_tiny_llama.yaml``
(tiny Llama, 8 x 64 tokens a step) three ways: the fast path, meshbatch's dataset
through Levanter's ``DataLoader`` (``data.fast_path: false``) and Levanter's own
``UrlSingleDatasetLMConfig`` (``shuffle: true``) on the same JSONL and tokenizer. Levanter builds
its own cache (with Ray) because its text configs expect every field of its tokenizer's output
(``token_type_ids``, ``attention_mask``), not a bare ``input_ids`` cache; the tokens are the same.
From the json_logger metrics: Levanter's own data wait per step (``throughput/loading_time``) and
``throughput/tokens_per_second``, means over steps 5 .. end (step 0 compiles).

    .venv-levanter/bin/python benchmarks/bench_levanter.py [--steps 100] [--seq-len 512] \
        [--batch 64] [--train-steps 60]

Loader rows: ``--seq-len`` x ``--batch`` (the corpus holds 434K tokens: several epochs).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import haliax as hax
import jax
import numpy as np
from harness import banner, write_json
from levanter.data.dataset import EpochDataset
from levanter.data.loader import DataLoader
from levanter.data.permutation import PermutationDataset
from levanter.data.text import CausalLmDataset, TokenSeqDataset
from levanter.store.cache import TreeCache

from meshbatch import ShuffleSpec
from meshbatch.cache import TokenCache
from meshbatch.datasets import CausalLMDataset
from meshbatch.levanter import MeshbatchDataset, PipelineLoader

EXAMPLES = pathlib.Path(__file__).parents[1] / "examples" / "levanter"


def prepare(root: pathlib.Path) -> str:
    for name in ("causal_tiny_llama.yaml", "prepare.py"):
        shutil.copy(EXAMPLES / name, root / name)
    subprocess.run([sys.executable, "prepare.py"], cwd=root, check=True)
    from meshbatch.cache import HFTokenizer, build_cache

    path = str(root / "cache" / "pydoc" / "train")
    build_cache(
        path,
        [str(root / "data" / "train.jsonl")],
        tokenizer=HFTokenizer(str(root / "byte_tokenizer" / "tokenizer.json")),
    )
    return path


def time_loader(make_iter, steps: int, tokens_per_step: int) -> float:
    """tokens/s of ``steps`` batches from a fresh iterator (after one warm-up pass)."""
    for warm in (True, False):
        stream = make_iter()
        start = time.perf_counter()
        for _ in range(10 if warm else steps):
            jax.block_until_ready(jax.tree.leaves(next(stream)))
        elapsed = time.perf_counter() - start
        stop = getattr(getattr(stream, "_batches", None), "stop", None)
        if stop is not None:
            stop()  # Levanter's producer thread would otherwise outlive the measurement
    return steps * tokens_per_step / elapsed


def loaders(path: str, *, seq_len: int, batch: int, steps: int) -> dict[str, float]:
    Pos = hax.Axis("position", seq_len)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    key = jax.random.PRNGKey(0)
    tree = TreeCache.load(path, {"input_ids": np.zeros(0, np.int32)})
    windows = CausalLmDataset(TokenSeqDataset(tree, seq_len), Pos, eos_id=256)
    # Epochs on (train_lm's `epoch`), so that it streams past the small corpus, as ours does.
    levanter = EpochDataset(PermutationDataset(windows, key, "feistel"), max_epochs=1000)
    ours = CausalLMDataset(
        TokenCache.open(path),
        seq_len,
        shuffle=ShuffleSpec("block", io_block_size=16, window_blocks=4),
        eos_id=256,
    )
    per_example = MeshbatchDataset(ours, Pos=Pos, key=key, epochs=None, fast_path=False)
    fast = PipelineLoader(
        MeshbatchDataset(ours, Pos=Pos, key=key, epochs=None),
        mesh=mesh,
        axis_mapping={"batch": "data"},
        batch_size=batch,
    )

    def dataloader(dataset):
        return lambda: DataLoader(dataset, batch, mesh=mesh, axis_resources={"batch": "data"}).iter_from_step(
            0
        )

    out = {}
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        for name, make in (
            ("Levanter DataLoader, CausalLmDataset + PermutationDataset", dataloader(levanter)),
            ("meshbatch MeshbatchDataset through Levanter's DataLoader", dataloader(per_example)),
            ("meshbatch fast path (PipelineLoader)", lambda: fast.iter_from_step(0)),
        ):
            out[name] = time_loader(make, steps, batch * seq_len)
            print(f"  {name}: {out[name] / 1e6:.2f} M tokens/s", flush=True)
    return out


def levanter_data(root: pathlib.Path) -> str:
    """The YAML's data: replaced by Levanter's own config over the same cache directory."""
    text = (root / "causal_tiny_llama.yaml").read_text()
    start, end = text.index("data:\n"), text.index("model:\n")
    data = (
        "data:\n  tokenizer: byte_tokenizer\n  cache_dir: cache/levanter\n"
        "  train_urls: [data/train.jsonl]\n  shuffle: true\n  permutation_type: feistel\n"
    )
    path = root / "levanter_tiny_llama.yaml"
    path.write_text(text[:start] + data + text[end:])
    return path.name


def train(root: pathlib.Path, config: str, steps: int, *args: str) -> dict[str, float]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("XLA_FLAGS", None)
    shutil.rmtree(root / "logs", ignore_errors=True)
    shutil.rmtree(root / "checkpoints", ignore_errors=True)
    command = [sys.executable, "-m", "meshbatch.levanter.train_lm", "--config_path", config,
               "--trainer.num_train_steps", str(steps), *args]  # fmt: skip
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-4000:])
    wait, rate = {}, {}
    for log in (root / "logs").rglob("*.log"):
        for line in log.read_text().splitlines():
            if '"event": "log"' in line:
                record = json.loads(line.split(" :: ", 1)[1])
                metrics, step = record["metrics"], record.get("step")
                if "throughput/loading_time" in metrics:
                    wait[step] = metrics["throughput/loading_time"]
                if "throughput/tokens_per_second" in metrics:
                    rate[step] = metrics["throughput/tokens_per_second"]
    later = [s for s in wait if s >= 5]
    return {
        "data_wait_ms": 1e3 * statistics.mean(wait[s] for s in later),
        "tokens_per_s": statistics.mean(rate[s] for s in later if s in rate),
        "first_step_wait_s": wait.get(0, float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    payload = banner("bench_levanter")
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        path = prepare(root)
        print(f"loader only: {args.batch} x {args.seq_len} tokens a step, {args.steps} steps", flush=True)
        payload["loaders"] = loaders(path, seq_len=args.seq_len, batch=args.batch, steps=args.steps)
        runs = {
            "meshbatch fast path": ("causal_tiny_llama.yaml",),
            "meshbatch through Levanter's DataLoader": (
                "causal_tiny_llama.yaml",
                "--data.fast_path",
                "false",
            ),
            "Levanter UrlSingleDatasetLMConfig": (levanter_data(root),),
        }
        payload["training"] = {}
        for name, (config, *extra) in runs.items():
            payload["training"][name] = result = train(root, config, args.train_steps, *extra)
            print(f"  {name}: {result}", flush=True)
    write_json(__file__, payload)


if __name__ == "__main__":
    main()
