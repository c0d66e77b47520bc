"""Running counts of flags (the compaction behind cycle walking) on XLA:CPU.

Three exact ways to compute ``cumsum(flags)`` for a row of booleans, jitted, in one process:
``jnp.cumsum`` (XLA:CPU lowers it to a windowed reduction), a 128-wide triangular float32 matmul
per block of flags (``scan._running_sum``, the earlier ``running_count``), and the current
``scan.running_count`` (32 flags packed per word, ``population_count`` within words, the matmul
only over the 32x shorter word totals). Each checked equal to numpy's cumsum. Rotating best and
median times, as in ``bench_permutation.py``.

    python benchmarks/bench_scan.py
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import numpy as np
from harness import banner, rotating_times, write_json

from meshbatch.kernels import scan

IMPLEMENTATIONS = {
    "jnp.cumsum": lambda f: jnp.cumsum(f.astype(jnp.int32), axis=-1, dtype=jnp.int32),
    "triangular matmul per 128 flags": lambda f: scan._running_sum(f.astype(jnp.float32)).astype(jnp.int32),
    "packed words + population_count": scan.running_count,
}


def run(sizes: list[int]) -> dict:
    env = banner("bench_scan")
    rows = []
    print(f"{'flags':>9} {'implementation':<34} {'best ms':>8} {'median ms':>10} {'vs matmul':>10}")
    for n in sizes:
        host = np.random.default_rng(n).random((1, n)) < 0.05
        flags = jnp.asarray(host)
        fns = {}
        for name, impl in IMPLEMENTATIONS.items():
            compiled = jax.jit(impl).lower(flags).compile()
            np.testing.assert_array_equal(np.asarray(compiled(flags)), np.cumsum(host, axis=-1))
            fns[name] = lambda c=compiled, f=flags: c(f).block_until_ready()
        times = rotating_times(fns, rounds=5, repeats=10)
        base = min(times["triangular matmul per 128 flags"])
        for name, values in times.items():
            best, median = min(values), statistics.median(values)
            rows.append({"n": n, "implementation": name, "best_seconds": best, "median_seconds": median})
            print(f"{n:>9} {name:<34} {best * 1e3:>8.3f} {median * 1e3:>10.3f} {base / best:>9.1f}x")
    return {"env": env, "rows": rows}


if __name__ == "__main__":
    write_json(__file__, run([125_000, 1_000_000]))
