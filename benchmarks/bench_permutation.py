"""Permutation throughput: our jitted Feistel against Levanter's numpy FeistelPermutation.

Method: for each n, Levanter's ``FeistelPermutation(n, key)(arange(n))`` (numpy, uint64) and our
jitted ``permutation(...)(arange(n))`` (uint32, one XLA computation) run in the same process, one
after the other. Each runs back to back (warm-up, then N timed runs with ``block_until_ready``)
and the implementations rotate for 5 rounds. Each reports its best time (``timeit``'s convention:
slower runs measure interference, not the code) and its median. On a shared 2-vCPU VM the two
disagree most for XLA: its big fusions run on both cores, and a host that takes one away for a
while doubles a run's time, while numpy runs on one core. The
allocator is glibc's default, as in a user's process; ``--keep-freed-memory`` makes glibc reuse
freed blocks instead (``harness.keep_freed_memory``), which spares both sides page faults and
mostly speeds up numpy's temporaries. Levanter-compatible outputs are checked equal to
Levanter's, element for element. The ceiling is one pass of each network over all n indices
(in the walk's lane layout) without cycle walking or range masks: no cycle-walked permutation
can beat it. Reported: indices/s and the ratio to Levanter, from best times and from medians.

    python benchmarks/bench_permutation.py [--quick] [--keep-freed-memory]
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from harness import banner, keep_freed_memory, rotating_times, write_json
from levanter.data._prp import FeistelPermutation

import meshbatch
from meshbatch.kernels.shuffles import feistel

U32 = jnp.uint32


@jax.jit
def _permute(perm, indices):
    return perm(indices)


@jax.jit
def _one_pass(perm, indices):
    # In the walk's lane layout (groups of feistel.GROUP): XLA:CPU runs a 1-D pass slower.
    return perm.network(indices.reshape(-1, feistel.GROUP)).reshape(-1)


def run(sizes: list[int], repeats: int, keep_freed: bool) -> dict:
    env = banner("bench_permutation")
    env["allocator"] = keep_freed_memory() if keep_freed else "glibc default"
    print(env["allocator"])
    key = jax.random.PRNGKey(0)
    rows = []
    header = (
        f"{'n':>10} {'implementation':<42} {'best idx/s':>11} {'ratio':>7} {'median idx/s':>13} {'ratio':>7}"
    )
    print(header)
    print("-" * len(header))
    for n in sizes:
        host = np.arange(n, dtype=np.int64)
        levanter_perm = FeistelPermutation(n, key)
        expected = levanter_perm(host)
        x = jnp.arange(n, dtype=U32)
        fns = {"levanter numpy FeistelPermutation": lambda p=levanter_perm, h=host: p(h)}
        for compat in ("levanter", None):
            perm = meshbatch.permutation("feistel", n, key, compat=compat)
            out = np.asarray(_permute(perm, x))
            if compat == "levanter":
                np.testing.assert_array_equal(out, expected)
            else:
                assert np.array_equal(np.sort(out), host), "strong default is not a bijection"
            fns[f"meshbatch feistel compat={compat}"] = lambda p=perm, x=x: _permute(p, x).block_until_ready()
            fns[f"ceiling: one network pass, compat={compat}"] = lambda p=perm, x=x: jax.block_until_ready(
                _one_pass(p, x)
            )
        times = rotating_times(fns, rounds=5, repeats=repeats)
        best = {name: min(values) for name, values in times.items()}
        median = {name: statistics.median(values) for name, values in times.items()}
        base = "levanter numpy FeistelPermutation"
        for name in fns:
            row = {
                "n": n,
                "implementation": name,
                "best_seconds": best[name],
                "median_seconds": median[name],
                "best_indices_per_s": n / best[name],
                "median_indices_per_s": n / median[name],
                "best_ratio": best[base] / best[name],
                "median_ratio": median[base] / median[name],
            }
            rows.append(row)
            print(
                f"{n:>10} {name:<42} {row['best_indices_per_s']:>11.3e} {row['best_ratio']:>6.1f}x"
                f" {row['median_indices_per_s']:>13.3e} {row['median_ratio']:>6.1f}x"
            )
    return {"env": env, "rows": rows, "outputs_equal_levanter": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e5 and 1e6, fewer repeats")
    parser.add_argument(
        "--keep-freed-memory", action="store_true", help="ask glibc to reuse freed blocks (both sides)"
    )
    args = parser.parse_args()
    sizes = [10**5, 10**6] if args.quick else [10**6, 10**7]
    write_json(__file__, run(sizes, repeats=2 if args.quick else 4, keep_freed=args.keep_freed_memory))


if __name__ == "__main__":
    main()
