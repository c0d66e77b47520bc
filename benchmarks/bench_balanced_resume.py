"""Token-balanced resume cost (issue 18, must-show 3): from a ``state_dict()`` at step 1, at step
1000 and at step 10000, against the replay a resume without the state makes (Levanter's fallback).

    .venv/bin/python benchmarks/bench_balanced_resume.py   # -> benchmarks/bench_balanced_resume.json

Each trial times ``load_state_dict`` + the first batch on an already-compiled ``Pipeline`` of a
three-source ``TokenBalancedMixture`` (causal windows, 16 rows of 64 tokens a step, one device);
the sides alternate, ``REPEATS`` times; medians and ranges in seconds.
"""

import json
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec, TokenBalancedMixture
from meshbatch.cache import CacheWriter, TokenCache

REPEATS = 5
STEPS = (1, 1000, 10000)


def caches(root: pathlib.Path) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for k, name in enumerate(("web", "code", "books")):
        path = str(root / name)
        with CacheWriter(path) as writer:
            writer.write(
                [rng.integers(2, 999, rng.integers(30, 400)).astype(np.int32) for _ in range(200 * (k + 1))]
            )
        out[name] = CausalLMDataset(TokenCache.open(path), 64, shuffle=ShuffleSpec("full"), eos_id=1)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
        pipeline = Pipeline(TokenBalancedMixture(caches(pathlib.Path(tmp))), mesh=mesh, batch_size=16, key=0)
        saved = {}
        for step in STEPS:
            pipeline.batch(step - 1)
            saved[step] = pipeline.state_dict()
        zero = {
            "version": 1,
            "step": 0,
            **{k: v for k, v in saved[1].items() if k not in ("version", "step")},
        }
        zero["datasets"] = [dict(e, row_offset=0, token_offset=0) for e in zero["datasets"]]
        sides = {f"state at step {s}": (saved[s], s) for s in STEPS}
        sides |= {f"replay to step {s} (no state)": (zero, s) for s in STEPS[1:]}
        times = {name: [] for name in sides}
        for _ in range(REPEATS):
            for name, (state, step) in sides.items():
                start = time.perf_counter()
                pipeline.load_state_dict(state)
                jax.block_until_ready(pipeline.batch(step))
                times[name].append(time.perf_counter() - start)
        rows = {
            name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)}
            for name, t in times.items()
        }
    for name, row in rows.items():
        print(
            f"| {name} | {row['median_s'] * 1e3:.1f} | {row['min_s'] * 1e3:.1f} - {row['max_s'] * 1e3:.1f} |"
        )
    out = pathlib.Path(__file__).with_suffix(".json")
    out.write_text(json.dumps({"repeats": REPEATS, "rows": rows}, indent=1))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
