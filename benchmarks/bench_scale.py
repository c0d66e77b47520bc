"""Costs at the corpus's shape: mixtures of 1 to 256 block-shuffled sources against Levanter.

Each cell runs in a fresh process on 8 virtual CPU devices, twice: with an empty persistent
compilation cache (cold) and again with the cache the first run left (warm). A cell reports:

* ``open_s``: opening the caches and making the datasets;
* ``first_batch_s``: from making the ``Pipeline`` (or Levanter's ``MixtureDataset`` and
  ``DataLoader``) to batch 0 on the devices;
* ``step_ms``: steady step time: the stream's ``--steps`` batches after its first ``--skip``
  (default 4), each taken as soon as the last is in hand, divided by their number.
  A step of many block-shuffled sources decodes each source's chunks on their first touch, which
  the first few dozen steps at 256 sources do (``--skip 64`` times the steps after them);
  the waits for each batch (p10, median, p90) beside it;
* ``cpu_ms``: process CPU time per steady step (every thread; on CPU devices the build's work is
  host work too).

Loaders, at each size (``--sources``), 256 rows of 1024 tokens (``--batch``, ``--seq-len``):

* ``stable``: ``meshbatch.Mixture`` of ``CausalLMDataset(shuffle=ShuffleSpec("block"))`` children,
  equal weights;
* ``balanced``: ``meshbatch.TokenBalancedMixture`` of the same children;
* ``--block-cache BYTES``: meshbatch's caches are opened with one shared ``BlockCache`` of that
  size (``docs/mixtures.md``: many block-shuffled sources), each chunk decoded once into host
  memory and every later window of it copied from there; 0 (the default): none;
* ``--open lazy``: meshbatch opens the caches from their ledgers (``TokenCache.open(...,
  eager=False)``, what a cache of more than 65,536 documents gets by default), not with every
  document offset loaded (``eager``, the default here: these caches hold 128 documents each);
* ``levanter``: Levanter's ``MixtureDataset`` of ``TokenSeqDataset(...).shuffle(key)`` children
  (Levanter 1.2.dev1644 has no block shuffle: a full Feistel permutation each) through its
  ``DataLoader``.

The caches are copies of one cache (each its own files), so every source reads from disk.

    .venv/bin/python benchmarks/bench_scale.py                       # 1, 16, 64, 256 sources
    .venv/bin/python benchmarks/bench_scale.py --sources 1,16 --steps 10   # a quick look

The corpus's other dimensions have their own scripts, run through this one with ``--part``
(their arguments follow):

    .venv/bin/python benchmarks/bench_scale.py --part shards       # bench_cache_open.py: caches of
        # 10-10,000 shards, locally and at a store 100 ms away, and a 10^7-document cache
    .venv/bin/python benchmarks/bench_scale.py --part first-batch  # bench_first_batch.py: one
        # block-shuffled causal pipeline, 256 x 4096, cold and warm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("stable", "balanced", "levanter")
PARTS = {"shards": "bench_cache_open.py", "first-batch": "bench_first_batch.py"}


# -- one cell, in its own process ------------------------------------------------------------------


def child(args) -> dict:
    """Runs one (kind, sources) cell and returns its figures."""
    import jax
    import numpy as np

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    names = [f"s{i:03d}" for i in range(args.sources)]
    paths = [os.path.join(args.data, name) for name in names]
    started = time.perf_counter()
    if args.kind == "levanter":
        make, batches = _levanter(paths, names, args, mesh)
    else:
        make, batches = _meshbatch(paths, names, args, mesh)
    opened = time.perf_counter()
    loader = make()
    stream = batches(loader, 0)
    jax.block_until_ready(next(stream))
    first = time.perf_counter()
    for _ in range(args.skip - 1):
        jax.block_until_ready(next(stream))
    # steady: the same stream's next --steps batches, each waited for as soon as the last is in
    # hand (a loader's buffers never get ahead of such a consumer: the time is its production's).
    # One stream, not a fresh one: Levanter's MixtureDataset caches blocks as tasks of its first
    # iterator's event loop, which a second iterator cannot await (async-lru >= 2.1).
    times, total, cpu = time_steps(stream, args.steps)
    _close(stream)
    q = statistics.quantiles(times, n=10)
    return {
        "kind": args.kind,
        "sources": args.sources,
        "open_s": opened - started,
        "first_batch_s": first - opened,
        "step_ms": 1e3 * total / args.steps,
        "wait_p10_ms": 1e3 * q[0],
        "wait_median_ms": 1e3 * statistics.median(times),
        "wait_p90_ms": 1e3 * q[-1],
        "cpu_ms": 1e3 * cpu / args.steps,
    }


def time_steps(stream, steps: int) -> tuple[list[float], float, float]:
    """Each of ``stream``'s next ``steps`` batches waited for as soon as the last is in hand: the
    waits, the wall time and the process CPU time of all of them (seconds)."""
    import jax

    times, cpu, total = [], time.process_time(), time.perf_counter()
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(next(stream))
        times.append(time.perf_counter() - start)
    return times, time.perf_counter() - total, time.process_time() - cpu


def _meshbatch(paths, names, args, mesh):
    from meshbatch import CausalLMDataset, Mixture, Pipeline, ShuffleSpec, TokenBalancedMixture
    from meshbatch.cache import BlockCache, TokenCache

    spec = ShuffleSpec("block")
    shared = BlockCache(args.block_cache) if args.block_cache else None
    kids = {
        name: CausalLMDataset(
            TokenCache.open(path, block_cache=shared, eager=args.open == "eager"), args.seq_len, shuffle=spec
        )
        for name, path in zip(names, paths, strict=True)
    }
    if args.kind == "stable":
        dataset = Mixture(kids, dict.fromkeys(names, 1.0), block_size=2048)
    else:
        dataset = TokenBalancedMixture(kids)

    def make():
        return Pipeline(dataset, mesh=mesh, batch_size=args.batch, key=0)

    return make, lambda pipeline, step: pipeline.iterate_from(step)


def _levanter(paths, names, args, mesh):
    import haliax as hax
    import jax
    import numpy as np
    from levanter.data.loader import DataLoader
    from levanter.data.mixture import MixtureDataset
    from levanter.data.text import TokenSeqDataset
    from levanter.store.cache import TreeCache

    exemplar = {"input_ids": np.zeros(0, np.int32)}
    key = jax.random.PRNGKey(0)
    kids = {
        name: TokenSeqDataset(TreeCache.load(path, exemplar), args.seq_len).shuffle(
            jax.random.fold_in(key, i)
        )
        for i, (name, path) in enumerate(zip(names, paths, strict=True))
    }

    def make():
        mixture = MixtureDataset(kids, dict.fromkeys(names, 1.0), 2048, key=key)
        with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
            return DataLoader(mixture, args.batch, mesh=mesh, axis_resources={"batch": "data"})

    def batches(loader, step):
        with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
            yield from loader.iter_from_step(step)

    return make, batches


def _close(stream) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        close()


# -- the driver ------------------------------------------------------------------------------------


def write_caches(root: str, sources: int, tokens: int) -> None:
    """``sources`` caches of ``tokens`` Zipf tokens: one written, the rest copied."""
    sys.path.insert(0, HERE)
    from harness import write_zipf_cache

    first = os.path.join(root, "s000")
    if not os.path.exists(first):
        write_zipf_cache(first, tokens, vocab=50_000)
    for i in range(1, sources):
        path = os.path.join(root, f"s{i:03d}")
        if not os.path.exists(path):
            shutil.copytree(first, path)


def run_cell(kind: str, sources: int, args, compile_cache: str) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_COMPILATION_CACHE_DIR"] = compile_cache
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    command = [
        sys.executable, __file__, "--child", kind, "--sources", str(sources), "--data", args.data,
        "--steps", str(args.steps), "--batch", str(args.batch), "--seq-len", str(args.seq_len),
        "--block-cache", str(args.block_cache), "--skip", str(args.skip), "--open", args.open,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode:
        raise RuntimeError(f"{kind} at {sources} sources failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    part = argparse.ArgumentParser(add_help=False)
    part.add_argument("--part", choices=[*sorted(PARTS), "mixtures"], default="mixtures")
    known, rest = part.parse_known_args()
    if known.part != "mixtures":  # the rest of the command line is that script's
        sys.exit(subprocess.call([sys.executable, os.path.join(HERE, PARTS[known.part]), *rest]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[part])
    parser.add_argument("--sources", default="1,16,64,256")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip", type=int, default=4, help="steps made before the timed stream (>= 1)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=1 << 20, help="tokens per cache")
    parser.add_argument(
        "--block-cache", type=int, default=0, help="bytes of a BlockCache meshbatch caches share (0: none)"
    )
    parser.add_argument(
        "--open",
        choices=("eager", "lazy"),
        default="eager",
        help="how meshbatch opens the caches: every offset loaded (eager) or from the ledger (lazy, "
        "as TokenCache.open opens a cache of more than 65,536 documents)",
    )
    parser.add_argument("--data", default=None, help="where the caches are (made if missing)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--label", default="scale", help="the JSON key of this run")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.skip < 1:
        parser.error(f"--skip must be >= 1 (got --skip {args.skip})")
    if args.child:
        args.kind, args.sources = args.child, int(args.sources)
        print(json.dumps(child(args)), flush=True)
        os._exit(0)  # Levanter's loader threads may abort the interpreter's teardown

    sys.path.insert(0, HERE)
    from harness import banner, write_json

    env = banner("bench_scale: mixtures of block-shuffled sources, cold and warm")
    sizes = [int(s) for s in args.sources.split(",")]
    kinds = args.kinds.split(",")
    scratch = tempfile.mkdtemp(prefix="bench_scale_")
    args.data = args.data or os.path.join(scratch, "caches")
    os.makedirs(args.data, exist_ok=True)
    write_caches(args.data, max(sizes), args.tokens)
    cells = []
    try:
        for sources in sizes:
            for kind in kinds:  # the kinds alternate at each size
                compile_cache = tempfile.mkdtemp(prefix="jax_", dir=scratch)
                for state in ("cold", "warm"):
                    cell = run_cell(kind, sources, args, compile_cache) | {"cache": state}
                    cells.append(cell)
                    step = f"{cell['step_ms']:.1f} ms [{cell['wait_p10_ms']:.1f}, {cell['wait_p90_ms']:.1f}]"
                    print(
                        f"{kind:>9} {sources:>4} sources {state}: open {cell['open_s']:.2f} s, first "
                        f"batch {cell['first_batch_s']:.2f} s, step {step}, cpu {cell['cpu_ms']:.1f} ms",
                        flush=True,
                    )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(cells, sizes, kinds)
    write_json(__file__, {args.label: {"env": env, "args": vars(args) | {"data": None}, "cells": cells}})


def print_table(cells, sizes, kinds) -> None:
    def get(kind, sources, state):
        return next(
            (c for c in cells if (c["kind"], c["sources"], c["cache"]) == (kind, sources, state)), None
        )

    print(
        "\n| loader | sources | first batch cold (s) | warm (s) | step (ms) | CPU/step (ms) "
        "| vs fewest sources: first cold / step | Levanter's step / this |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind in kinds:
        for sources in sizes:
            cold, warm = get(kind, sources, "cold"), get(kind, sources, "warm")
            one = get(kind, min(sizes), "cold"), get(kind, min(sizes), "warm")
            lev = get("levanter", sources, "warm")
            first_ratio = cold["first_batch_s"] / one[0]["first_batch_s"]
            vs_one = f"{first_ratio:.2f}x / {warm['step_ms'] / one[1]['step_ms']:.2f}x"
            vs_lev = f"{lev['step_ms'] / warm['step_ms']:.1f}x" if lev and kind != "levanter" else ""
            print(
                f"| {kind} | {sources} | {cold['first_batch_s']:.2f} | {warm['first_batch_s']:.2f} | "
                f"{warm['step_ms']:.1f} [{warm['wait_p10_ms']:.1f}, {warm['wait_p90_ms']:.1f}] | "
                f"{warm['cpu_ms']:.1f} | {vs_one} | {vs_lev} |"
            )


if __name__ == "__main__":
    main()
