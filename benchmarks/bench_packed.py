"""Packed chat batches: ``PackedDataset`` through ``Pipeline`` against Levanter's packed loader.

One generated chat cache (written by Levanter's ``SerialCacheWriter``: ``input_ids`` +
``assistant_masks``; example lengths log-normal, median ``--median`` tokens, 8 .. 8192, ids and
masks random), read by both sides in the same run, on one CPU device:

* Levanter: ``MultiturnChatDataset(cache, Pos, max_segments_per_example=64)`` (its
  ``GreedyPrepackedDataset`` and its per-example ``LmExample``), ``get_batch`` of ``--batch``
  packed rows a step through ``as_sync_dataset()`` (what its ``DataLoader`` asks for a step,
  before stacking: the stacking is not timed);
* meshbatch: ``Pipeline(PackedDataset(cache, seq_len, ...), batch_size=batch)``, ``batch(step)``
  until every leaf is ready, for ``compat="levanter"`` (the same rows) and the default policy
  (first fit over windows of 512 shuffled examples).

Each side twice: packed rows in order (``ShuffleSpec("none")``; Levanter's rows ``k * batch ..``),
and shuffled (meshbatch's default full shuffle of rows; Levanter asked for a permutation of its
rows, as its ``PermutationDataset`` would), where a step's rows lie anywhere in the cache.

Host time per step: wall time of one step's batch (step 0, which compiles, not counted), the
sides alternating for ``--rounds`` rounds of ``--steps`` steps each, each round on fresh steps;
medians and ranges over every timed step. Setup: the time to construct each side (Levanter packs
every example in Python; meshbatch opens, checks and packs with a jitted kernel). Packing
efficiency (real tokens over slots, after Levanter's slicing of long examples) of every policy,
Levanter's own from its pack ranges.

    .venv/bin/python benchmarks/bench_packed.py [--examples 20000] [--seq-len 4096] [--batch 256] \
        [--steps 3] [--rounds 3] [--median 600]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import haliax as hax
import jax
import numpy as np
from harness import banner, keep_freed_memory, write_json
from levanter.data.text import MultiturnChatDataset
from levanter.store.cache import SerialCacheWriter, TreeCache

from meshbatch import PackedDataset, Pipeline, ShuffleSpec

EXEMPLAR = {"input_ids": np.zeros((0,), np.int32), "assistant_masks": np.zeros((0,), np.int32)}


def write_corpus(path: str, examples: int, median: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median), 1.0, examples), 8, 8192).astype(np.int64)
    with SerialCacheWriter(path, EXEMPLAR) as writer:
        for lo in range(0, examples, 256):
            rows = []
            for n in lengths[lo : lo + 256]:
                mask = (rng.random(n) < 0.5).astype(np.int32)
                mask[0] = 0
                rows.append(
                    {"input_ids": rng.integers(3, 50_000, n).astype(np.int32), "assistant_masks": mask}
                )
            writer.write_batch(rows)
    return lengths


def summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "n": len(times)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--median", type=int, default=600)
    args = parser.parse_args()
    env = banner("packed chat batches: PackedDataset vs Levanter's MultiturnChatDataset")
    env["allocator"] = keep_freed_memory()
    S, B = args.seq_len, args.batch
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    with tempfile.TemporaryDirectory() as root:
        path = str(pathlib.Path(root) / "chat")
        start = time.perf_counter()
        lengths = write_corpus(path, args.examples, args.median)
        print(f"  corpus: {args.examples} examples, {int(lengths.sum())} tokens "
              f"({time.perf_counter() - start:.1f} s to write)", flush=True)  # fmt: skip

        setup = {}
        start = time.perf_counter()
        levanter = MultiturnChatDataset(
            TreeCache.load(path, EXEMPLAR), hax.Axis("position", S), max_segments_per_example=64
        )
        levanter_sync = levanter.as_sync_dataset()
        setup["levanter MultiturnChatDataset"] = time.perf_counter() - start
        pipelines = {}
        for name, kwargs in (
            ("meshbatch compat='levanter'", dict(compat="levanter", shuffle=ShuffleSpec("none"))),
            ("meshbatch first fit", dict(shuffle=ShuffleSpec("none"))),
            ("meshbatch compat='levanter', rows shuffled", dict(compat="levanter")),
            ("meshbatch first fit, rows shuffled", {}),
        ):
            start = time.perf_counter()
            dataset = PackedDataset(path, S, **kwargs)
            pipelines[name] = Pipeline(dataset, mesh=mesh, batch_size=B, key=0, warmup=False)
            setup[name] = time.perf_counter() - start
        for name, seconds in setup.items():
            print(f"  setup {name}: {seconds:.2f} s", flush=True)

        kept = np.minimum(lengths, S).sum()
        packs = levanter.packed._pack_indices
        fill = {"levanter GreedyPrepackedDataset": float(kept) / (len(packs) * S)}
        for name, kwargs in (
            ("compat='levanter'", dict(compat="levanter")),
            ("first fit (window 512)", {}),
            ("first fit decreasing (window 512)", dict(decreasing=True)),
            ("first fit (window 4096)", dict(window=4096)),
            ("pack=False (padded)", dict(pack=False)),
        ):
            host = PackedDataset(path, S, **kwargs).make(jax.random.key(0))[1]
            fill[name] = host.fill()
        for name, value in fill.items():
            print(f"  fill {name}: {value:.4f}", flush=True)

        order = np.random.default_rng(0).permutation(len(packs))  # what its PermutationDataset asks for
        sides = {
            "levanter MultiturnChatDataset.get_batch": lambda step: levanter_sync.get_batch(
                list(range(step * B, (step + 1) * B))
            ),
            "levanter MultiturnChatDataset.get_batch, rows shuffled": lambda step: levanter_sync.get_batch(
                order[step * B : (step + 1) * B].tolist()
            ),
        }
        for name, pipeline in pipelines.items():
            sides[name] = lambda step, p=pipeline: jax.block_until_ready(jax.tree.leaves(p.batch(step)))
        for fn in sides.values():  # step 0: compiles (meshbatch), warms caches (both)
            fn(0)
        rows_per_epoch = min(len(packs), min(p._host.num_examples for p in pipelines.values()))
        if (1 + args.rounds * args.steps) * B > rows_per_epoch:
            print(f"  note: {rows_per_epoch} packed rows an epoch; later steps wrap", file=sys.stderr)
        times: dict[str, list[float]] = {name: [] for name in sides}
        step = 1
        for _ in range(args.rounds):
            for name, fn in sides.items():
                for k in range(args.steps):
                    begin = time.perf_counter()
                    fn(step + k)
                    times[name].append(time.perf_counter() - begin)
            step += args.steps
        results = {name: summary(t) for name, t in times.items()}
        for name, r in results.items():
            print(f"  {name}: {r['median_s'] * 1e3:.0f} ms/step (min {r['min_s'] * 1e3:.0f}, "
                  f"max {r['max_s'] * 1e3:.0f}, n={r['n']})", flush=True)  # fmt: skip
    payload = {
        "env": env,
        "args": vars(args),
        "tokens": int(lengths.sum()),
        "setup_s": setup,
        "fill": fill,
        "step_time": results,
    }
    write_json(__file__, {f"run_{args.seq_len}x{args.batch}": payload})


if __name__ == "__main__":
    main()
