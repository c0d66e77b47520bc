"""Kernel microbenchmarks through ``meshbatch.bench``: the causal build, the era and block
shuffles, the stable-mixture lookup (and every other family with ``--all``), in rounds.

Method: each round is one ``meshbatch.bench.run_bench`` of the named benchmarks at the default
shapes (``Shapes()``: 1024 rows of 2048 tokens, shuffles over 2^30 examples, 16 sources):
``jax.jit(fn).trace / .lower / .compile`` timed apart, then >= 20 calls each followed by
``block_until_ready`` (median, p10, p90), the dispatch rate, recompiles for another step and
another key, XLA's bytes accessed against the measured copy bandwidth. The benchmarks alternate
within a round and the rounds repeat, so a noisy neighbour's slow spell spreads over all of them;
reported per benchmark: the median of the rounds' medians and their range. A fresh jit per round
compiles again (the persistent compilation cache is off unless the environment turns it on).

    python benchmarks/bench_kernels.py [--rounds 3] [--all] [--tiny]
"""

from __future__ import annotations

import argparse
import statistics

from harness import banner, write_json

from meshbatch.bench import ALL, TINY, Shapes, run_bench

NEW_ROWS = ("causal_build", "era_shuffle", "block_shuffle", "stable_mixture_lookup")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--all", action="store_true", help="every family and the pipeline step")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    args = parser.parse_args()
    env = banner("bench_kernels")
    names = list(ALL) if args.all else list(NEW_ROWS)
    shapes = TINY if args.tiny else Shapes()
    reports = [run_bench(names, shapes) for _ in range(args.rounds)]
    rows = []
    print(
        f"{'benchmark':<24} {'compile ms':>11} {'run median ms':>14} {'range over rounds':>22} "
        f"{'recompiles':>10}"
    )
    for i, name in enumerate(names):
        results = [report["results"][i] for report in reports]
        medians = [r["run"]["median_s"] for r in results]
        compiles = [r["compile_s"] for r in results]
        row = {
            "name": name,
            "run_median_s": statistics.median(medians),
            "run_median_range_s": [min(medians), max(medians)],
            "compile_median_s": statistics.median(compiles),
            "recompiles": max(r["recompiles"] for r in results),
            "rounds": results,
        }
        rows.append(row)
        print(
            f"{name:<24} {row['compile_median_s'] * 1e3:>11.1f} {row['run_median_s'] * 1e3:>14.3f} "
            f"{medians and f'{min(medians) * 1e3:.3f}-{max(medians) * 1e3:.3f}':>22} {row['recompiles']:>10}"
        )
    key = "tiny" if args.tiny else "default"
    write_json(
        __file__,
        {
            key: {
                "env": env | reports[0]["environment"],
                "shapes": reports[0]["shapes"],
                "copy_bandwidth_bytes_per_s": reports[0]["copy_bandwidth_bytes_per_s"],
                "rows": rows,
            }
        },
    )


if __name__ == "__main__":
    main()
