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

``--part mixture64``: time to the first training step of a Levanter mixture ``data:`` block of
``--components`` components (the demo's training documents dealt round-robin into that many JSONL
files), the tiny Llama trained ``--mixture-steps`` steps through ``python -m
meshbatch.levanter.train_lm`` twice per round: Levanter's own ``LMMixtureDatasetConfig`` block
(``configs: {c00: {train_urls: [...]}, ...}``, equal ``train_weights``, top-level ``shuffle: true``,
``permutation_type: feistel``, one ``cache_dir``, no validation sets) and the same block with
``type: stable_mixture`` added. The caches are built first, untimed, by one run of meshbatch's
side (its in-process builder: Levanter's processor and writer, so Levanter finds them finished;
Levanter's own Ray builder starts an actor per component, 64 of them on this 2-core machine), and
one run of Levanter's side checks it finds them; then the two sides alternate for ``--rounds``
rounds. Per run: ``first_step_s``, wall time from the process
start to the trainer's first ``train_step`` call (the step-0 batch handed over; the runner patches
``Trainer.train_step`` to note the time, nothing else), ``first_step_wait_s`` (Levanter's
``throughput/loading_time`` at step 0: the trainer's wait for that batch), ``data_wait_ms`` (its
mean over steps 2 .. end); medians and ranges over the rounds, and the ratio of the medians.

    .venv-levanter/bin/python benchmarks/bench_levanter.py --part mixture64 [--components 64] \
        [--rounds 3] [--mixture-steps 12] [--compat]

``--compat`` adds ``compat: levanter`` and ``mixture_compat: levanter`` to meshbatch's side
(Levanter's batches: its permutations, block order and component keys); a key of its own.
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


# Runs train_lm's entry point as `python -m` does, noting (on stderr) when the trainer first calls
# train_step: the moment the step-0 batch is handed over, before the step compiles.
TIMED_TRAIN_LM = """
import json, runpy, sys, time
from levanter.trainer import Trainer
original = Trainer.train_step
def train_step(self, *args, **kwargs):
    if not getattr(Trainer, "_bench_seen", False):
        Trainer._bench_seen = True
        print("BENCH_FIRST_STEP " + json.dumps(time.time()), file=sys.stderr, flush=True)
    return original(self, *args, **kwargs)
Trainer.train_step = train_step
sys.argv[0] = "train_lm"
runpy.run_module("meshbatch.levanter.train_lm", run_name="__main__", alter_sys=True)
"""


def mixture_corpus(root: pathlib.Path, components: int) -> list[str]:
    """The demo's training documents dealt round-robin into ``components`` JSONL files."""
    for name in ("causal_tiny_llama.yaml", "prepare.py"):
        shutil.copy(EXAMPLES / name, root / name)
    subprocess.run([sys.executable, "prepare.py"], cwd=root, check=True)
    docs = (root / "data" / "train.jsonl").read_text().splitlines()
    (root / "data" / "mix").mkdir()
    names = [f"c{i:02d}" for i in range(components)]
    for i, name in enumerate(names):
        (root / "data" / "mix" / f"{name}.jsonl").write_text("".join(d + "\n" for d in docs[i::components]))
    return names


def mixture_configs(root: pathlib.Path, names: list[str], compat: bool = False) -> dict[str, str]:
    """The tiny Llama YAML with a Levanter mixture ``data:`` block: Levanter's own, and the same
    block with ``type: stable_mixture`` added."""
    text = (root / "causal_tiny_llama.yaml").read_text()
    start, end = text.index("data:\n"), text.index("model:\n")
    configs = "".join(f"    {n}: {{train_urls: [data/mix/{n}.jsonl]}}\n" for n in names)
    weights = ", ".join(f"{n}: 1.0" for n in names)
    out = {}
    ours = "  type: stable_mixture\n" + ("  compat: levanter\n  mixture_compat: levanter\n" if compat else "")
    for side, typed in (("meshbatch", ours), ("levanter", "")):
        block = (
            f"data:\n{typed}  tokenizer: byte_tokenizer\n  cache_dir: cache/mix\n"
            f"  shuffle: true\n  permutation_type: feistel\n  configs:\n{configs}"
            f"  train_weights: {{{weights}}}\n"
        )
        path = root / f"mixture_{side}.yaml"
        path.write_text(text[:start] + block + text[end:])
        out[side] = path.name
    return out


def timed_train(root: pathlib.Path, config: str, steps: int) -> dict[str, float]:
    """One ``train_lm`` run: time to the first ``train_step`` call, Levanter's data waits."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("XLA_FLAGS", None)
    for name in ("logs", "checkpoints"):
        shutil.rmtree(root / name, ignore_errors=True)
    command = [sys.executable, "-c", TIMED_TRAIN_LM, "--config_path", config,
               "--trainer.num_train_steps", str(steps), "--trainer.steps_per_eval", "100000"]  # fmt: skip
    start = time.time()
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    total = time.time() - start
    if done.returncode:
        raise RuntimeError(done.stderr[-4000:])
    first = [line for line in done.stderr.splitlines() if line.startswith("BENCH_FIRST_STEP ")]
    wait = {}
    for log in (root / "logs").rglob("*.log"):
        for line in log.read_text().splitlines():
            if '"event": "log"' in line:
                record = json.loads(line.split(" :: ", 1)[1])
                if "throughput/loading_time" in record["metrics"]:
                    wait[record.get("step")] = record["metrics"]["throughput/loading_time"]
    return {
        "first_step_s": float(first[0].split()[1]) - start,
        "first_step_wait_s": wait[0],
        "data_wait_ms": 1e3 * statistics.mean([wait[s] for s in wait if s >= 2] or [float("nan")]),
        "run_s": total,
    }


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def mixture64(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        names = mixture_corpus(root, args.components)
        configs = mixture_configs(root, names, args.compat)
        for side, config in configs.items():  # meshbatch's side builds the caches; not timed
            print(f"  untimed first run of {side}: {timed_train(root, config, 1)}", flush=True)
        runs: dict[str, list[dict]] = {side: [] for side in configs}
        for r in range(args.rounds):
            order = list(configs) if r % 2 == 0 else list(configs)[::-1]
            for side in order:
                runs[side].append(result := timed_train(root, configs[side], args.mixture_steps))
                print(f"  round {r} {side}: {result}", flush=True)
    out: dict = {
        "components": args.components,
        "train_steps": args.mixture_steps,
        "rounds": args.rounds,
        "levanter": "LMMixtureDatasetConfig (no type:), shuffle: true, permutation_type: feistel",
        "meshbatch": "the same block + type: stable_mixture"
        + (", compat: levanter, mixture_compat: levanter (Levanter's order)" if args.compat else "")
        + " (fast path)",
    }
    for side, results in runs.items():
        out[side + " figures"] = {k: summary([r[k] for r in results]) for k in results[0]}
    ours, theirs = out["meshbatch figures"], out["levanter figures"]
    for key in ("first_step_s", "first_step_wait_s"):
        out[f"ratio meshbatch / levanter, {key}"] = ours[key]["median"] / theirs[key]["median"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parts = ("loaders_and_training", "mixture64")
    parser.add_argument("--part", choices=parts, default=parts[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--components", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mixture-steps", type=int, default=12)
    parser.add_argument("--compat", action="store_true", help="mixture64: meshbatch in Levanter's order")
    args = parser.parse_args()
    payload = banner("bench_levanter")
    if args.part == "mixture64":
        key = f"mixture{args.components}_first_step" + ("_compat_levanter" if args.compat else "")
        write_json(__file__, {key: {**payload, **mixture64(args)}})
        return
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
