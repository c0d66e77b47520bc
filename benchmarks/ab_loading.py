"""Paired A/B of the host read path: this checkout's ``TokenCache`` against an older one, in one process.

``bench_loading.py`` run twice (before, after) on a shared machine differs by more than any code
change when a neighbour's load moves; this script isolates the change instead. The older code is
imported as the package ``meshbatch_base`` (a copy of its ``src/meshbatch`` with ``kernels/`` inside,
imports renamed), and both read the same cache with the same index arrays, alternating round by
round, the side that goes first alternating: each round opens the cache afresh on both sides
(untimed), reads batch 0 (warm-up; tokens must be identical), then times batches 1..k. Reported:
median tokens/s of each side over the rounds and the median of the per-round ratios new / base
(1.00 = no change).

Patterns, on ``seq_len``-token examples: ``sequential``; ``full`` (a numpy permutation of examples:
the read pattern of a full shuffle); ``block`` (blocks of ``io_block`` consecutive examples in a
random block order: the read pattern of a block shuffle, without a block cache).

    git archive <base-commit> src/meshbatch kernels | tar -x -C /tmp/base
    mkdir -p /tmp/base_pkg && cp -r /tmp/base/src/meshbatch /tmp/base_pkg/meshbatch_base
    rm -rf /tmp/base_pkg/meshbatch_base/kernels
    cp -r /tmp/base/kernels /tmp/base_pkg/meshbatch_base/kernels
    grep -rl meshbatch /tmp/base_pkg/meshbatch_base | xargs sed -i -E \\
        's/\\bfrom meshbatch\\b/from meshbatch_base/g; s/\\bimport meshbatch\\b/import meshbatch_base/g;
         s/\\bmeshbatch\\.(kernels|cache)/meshbatch_base.\\1/g'
    PYTHONPATH=/tmp/base_pkg python benchmarks/ab_loading.py --cache /tmp/meshbatch-bench-loading-4096x4096
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import tensorstore as ts
from harness import banner, write_json

import meshbatch.cache as new


def index_batches(pattern: str, examples: int, batch: int, io_block: int, seed: int = 0) -> np.ndarray:
    """Physical example indices, ``[examples // batch, batch]``."""
    rng = np.random.default_rng(seed)
    if pattern == "sequential":
        order = np.arange(examples)
    elif pattern == "full":
        order = rng.permutation(examples)
    else:
        blocks = rng.permutation(examples // io_block)
        order = (blocks[:, None] * io_block + np.arange(io_block)).reshape(-1)
    return order[: examples // batch * batch].reshape(-1, batch)


def main(argv=None) -> dict:
    import meshbatch_base.cache as base

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", required=True, help="a cache of examples x seq_len tokens")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[64, 2048])
    parser.add_argument("--io-block", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batches", type=int, default=32, help="timed batches per round, at most")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 3
    env = banner("ab_loading")
    examples = new.TokenCache.open(args.cache).num_tokens // args.seq_len
    rows = []
    print("| pattern | batch | base tok/s | new tok/s | new / base (median of paired rounds) |")
    print("|---|---|---|---|---|")
    for pattern in ("sequential", "full", "block"):
        for batch in args.batch_sizes:
            order = index_batches(pattern, examples, batch, args.io_block)
            timed = range(1, min(order.shape[0], args.batches + 1))
            rates: dict[str, list[float]] = {"base": [], "new": []}
            for r in range(args.rounds):
                first = {}
                sides = (("base", base), ("new", new))
                for side, module in sides if r % 2 == 0 else sides[::-1]:  # who goes first alternates
                    context = ts.Context({"cache_pool": {"total_bytes_limit": 10**9}})
                    cache = module.TokenCache.open(args.cache, context=context)
                    first[side] = cache.read_spans(order[0] * args.seq_len, args.seq_len).tokens
                    start = time.perf_counter()
                    for b in timed:
                        cache.read_spans(order[b] * args.seq_len, args.seq_len)
                    rates[side].append(len(timed) * batch * args.seq_len / (time.perf_counter() - start))
                assert np.array_equal(first["base"], first["new"]), "the two sides read different tokens"
            ratio = statistics.median(n / b for n, b in zip(rates["new"], rates["base"], strict=True))
            row = {
                "pattern": pattern,
                "batch": batch,
                "base_tokens_per_s": statistics.median(rates["base"]),
                "new_tokens_per_s": statistics.median(rates["new"]),
                "new_over_base": ratio,
                "rounds": args.rounds,
            }
            rows.append(row)
            print(
                f"| {pattern} | {batch} | {row['base_tokens_per_s'] / 1e6:.1f} M | "
                f"{row['new_tokens_per_s'] / 1e6:.1f} M | {ratio:.3f} |",
                flush=True,
            )
    result = {**env, "cache": args.cache, "seq_len": args.seq_len, "rows": rows}
    write_json(__file__, result)
    return result


if __name__ == "__main__":
    main()
