"""Permutation throughput: our jitted Feistel against Levanter's numpy FeistelPermutation.

Method: for each n, Levanter's ``FeistelPermutation(n, key)(arange(n))`` (numpy, uint64) and our
jitted ``permutation(...)(arange(n))`` (uint32, one XLA computation) run in the same process, one
after the other. Each is warmed up once (ours: compile), then timed as the median of N runs with
``block_until_ready``. Levanter-compatible outputs are checked equal to Levanter's, element for
element. The ceiling is one pass of each network over all n indices without cycle walking: no
cycle-walked permutation can beat it. Reported: indices/s and the ratio to Levanter.

    python benchmarks/bench_permutation.py [--quick]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from harness import banner, median_seconds, write_json
from levanter.data._prp import FeistelPermutation

import meshbatch

U32 = jnp.uint32


@jax.jit
def _permute(perm, indices):
    return perm(indices)


@jax.jit
def _one_pass(perm, indices):
    return perm.network(indices)


def run(sizes: list[int], repeats: int) -> dict:
    env = banner("bench_permutation")
    key = jax.random.PRNGKey(0)
    rows = []
    header = f"{'n':>10} {'implementation':<34} {'indices/s':>12} {'vs levanter':>12}"
    print(header)
    print("-" * len(header))
    for n in sizes:
        host = np.arange(n, dtype=np.int64)
        levanter_perm = FeistelPermutation(n, key)
        expected = levanter_perm(host)
        base = median_seconds(lambda p=levanter_perm, h=host: p(h), repeats=max(1, repeats // 2))
        x = jnp.arange(n, dtype=U32)
        measured = {"levanter numpy FeistelPermutation": base}
        for compat in ("levanter", None):
            perm = meshbatch.permutation("feistel", n, key, compat=compat)
            name = f"meshbatch feistel compat={compat}"
            out = np.asarray(_permute(perm, x))
            if compat == "levanter":
                np.testing.assert_array_equal(out, expected)
            else:
                assert np.array_equal(np.sort(out), host), "strong default is not a bijection"
            measured[name] = median_seconds(
                lambda p=perm, x=x: _permute(p, x).block_until_ready(), repeats=repeats
            )
            measured[f"ceiling: one network pass compat={compat}"] = median_seconds(
                lambda p=perm, x=x: _one_pass(p, x).block_until_ready(), repeats=repeats
            )
        for name, seconds in measured.items():
            rate = n / seconds
            ratio = base / seconds
            rows.append(
                {"n": n, "implementation": name, "seconds": seconds, "indices_per_s": rate, "ratio": ratio}
            )
            print(f"{n:>10} {name:<34} {rate:>12.3e} {ratio:>11.1f}x")
    return {"env": env, "rows": rows, "outputs_equal_levanter": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e5 and 1e6, fewer repeats")
    args = parser.parse_args()
    sizes = [10**5, 10**6] if args.quick else [10**6, 10**7]
    write_json(__file__, run(sizes, repeats=3 if args.quick else 7))


if __name__ == "__main__":
    main()
