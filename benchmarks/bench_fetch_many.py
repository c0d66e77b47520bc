"""The fetch's host work at many sources: one read plan for all caches vs. a plan per cache.

One process, both sides alternating: a step of ``--rows`` windows of ``--seq-len`` tokens, each from
a random one of ``--sources`` caches at a random window (as a stable mixture of block-shuffled
sources reads them), planned with ``prepare_reads`` (one plan) or with one ``prepare_read`` per
touched cache (as before), then read (``run_reads``). Reports the planning and the reads
(TensorStore reads and the ledger checks) per step, median [range] over ``--repeats`` rounds of
``--steps`` steps each, after ``--warmup`` steps that decode and verify every chunk once.

    MESHBATCH_TS_CACHE_BYTES=2147483648 .venv/bin/python benchmarks/bench_fetch_many.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=256)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=1 << 20, help="tokens per cache")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", required=True, help="where the caches are (made if missing)")
    parser.add_argument("--label", default="fetch_many")
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    from bench_scale import write_caches
    from harness import banner, write_json

    from meshbatch.cache import TokenCache, run_reads
    from meshbatch.cache.read.many import prepare_reads

    env = banner("bench_fetch_many: one read plan for all caches vs. one per cache")
    os.makedirs(args.data, exist_ok=True)
    write_caches(args.data, args.sources, args.tokens)
    caches = [TokenCache.open(os.path.join(args.data, f"s{i:03d}")) for i in range(args.sources)]
    windows = args.tokens // args.seq_len
    rng = np.random.default_rng(0)
    out = np.zeros(args.rows * args.seq_len, np.int32)

    def step_spans():
        source = np.sort(rng.integers(0, args.sources, args.rows))
        starts = rng.integers(0, windows, args.rows) * args.seq_len
        return source, starts, np.full(args.rows, args.seq_len)

    def per_cache(source, starts, lengths):
        reads, at = [], 0
        for c in np.unique(source).tolist():
            mine = np.flatnonzero(source == c)
            read = caches[c].prepare_read(starts[mine], lengths[mine], out, at)
            reads.append(read)
            at = read.end
        return reads

    def one_plan(source, starts, lengths):
        touched, slot = np.unique(source, return_inverse=True)
        return prepare_reads([caches[c] for c in touched.tolist()], slot, starts, lengths, out, 0).reads

    sides = {"per-cache": per_cache, "one plan": one_plan}
    for _ in range(args.warmup):
        run_reads(one_plan(*step_spans()))
    figures = {name: {"plan_ms": [], "read_ms": [], "touched": []} for name in sides}
    for r in range(args.repeats):
        for name in sides if r % 2 == 0 else reversed(list(sides)):
            plan, read = [], []
            for _ in range(args.steps):
                spans = step_spans()
                began = time.perf_counter()
                reads = sides[name](*spans)
                planned = time.perf_counter()
                run_reads(reads)
                plan.append(planned - began)
                read.append(time.perf_counter() - planned)
                figures[name]["touched"].append(int(np.unique(spans[0]).size))
            figures[name]["plan_ms"].append(1e3 * statistics.median(plan))
            figures[name]["read_ms"].append(1e3 * statistics.median(read))
            print(f"round {r} {name:>9}: plan {figures[name]['plan_ms'][-1]:.2f} ms, "
                  f"reads {figures[name]['read_ms'][-1]:.2f} ms", flush=True)  # fmt: skip
    print("\n| plan | caches touched a step | plan (ms) | reads + checks (ms) |\n|---|---:|---:|---:|")
    for name, f in figures.items():
        cells = [
            f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" for v in (f["plan_ms"], f["read_ms"])
        ]
        print(f"| {name} | {statistics.median(f['touched']):.0f} | {cells[0]} | {cells[1]} |")
    pool = os.environ.get("MESHBATCH_TS_CACHE_BYTES", "default")
    write_json(__file__, {args.label: {"env": env, "args": vars(args), "pool": pool, "figures": figures}})


if __name__ == "__main__":
    main()
