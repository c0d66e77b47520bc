"""The cold and warm first batch of a block-shuffled causal pipeline, and what it compiles.

A block-shuffled ``CausalLMDataset`` (``ShuffleSpec("block")``), 256 rows x 4096 tokens over 8
virtual CPU devices. Each measurement is a fresh interpreter (``--child``): cold with a fresh JAX
persistent compilation cache directory, warm with the directory the cold run just filled. It times
``Pipeline(...)`` and the first ``batch(0)`` ready, from before the pipeline is made, and lists
every program traced, lowered and compiled (``jax.monitoring`` durations, by function name).

    python benchmarks/bench_first_batch.py --reps 3
    python benchmarks/bench_first_batch.py --reps 3 --variant before=/tmp/before_path   # A/B

``--variant name=dir`` runs the children with ``PYTHONPATH=dir`` (a tree whose ``meshbatch``
package is another version); the variants alternate in order from one repetition to the next.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SEQ, BATCH, DEVICES = 4096, 256, 8


def child(cache: str) -> None:
    started = time.perf_counter()
    import jax

    events: list[tuple[str, str, float]] = []

    def duration(name, seconds, **kwargs):
        events.append((name.rsplit("/", 1)[-1], str(kwargs.get("fun_name", "")), float(seconds)))

    counts = {"hits": 0, "misses": 0}

    def event(name, **kwargs):
        if name.endswith("cache_hits"):
            counts["hits"] += 1
        elif name.endswith("cache_misses"):
            counts["misses"] += 1

    jax.monitoring.register_event_duration_secs_listener(duration)
    jax.monitoring.register_event_listener(event)
    import numpy as np
    from jax.sharding import Mesh

    import meshbatch
    from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
    from meshbatch.cache import TokenCache

    imported, cpu = time.perf_counter(), time.process_time()
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("data",))
    dataset = CausalLMDataset(TokenCache.open(cache), SEQ, shuffle=ShuffleSpec("block"))
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=0)
    made = time.perf_counter()
    first = jax.block_until_ready(pipeline.batch(0))
    ready, ready_cpu = time.perf_counter(), time.process_time()
    second = jax.block_until_ready(pipeline.batch(1))
    after = time.perf_counter()
    out = {
        "meshbatch": os.path.dirname(meshbatch.__file__),
        "import_s": imported - started,
        "make_s": made - imported,
        "first_batch_s": ready - imported,  # Pipeline(...) and batch 0 ready
        "first_batch_cpu_s": ready_cpu - cpu,  # CPU seconds of all threads meanwhile
        "second_batch_s": after - ready,
        "checksum": int(np.asarray(first.tokens).sum()) ^ int(np.asarray(second.tokens).sum()),
        "events": events,
        **counts,
    }
    print("RESULT " + json.dumps(out))


def write_cache(path: str) -> None:
    import numpy as np

    from meshbatch.cache import CacheWriter

    rng = np.random.default_rng(0)
    docs, total = [], 0
    while total < 16 * SEQ * BATCH // 2:  # 8 batches of tokens
        doc = rng.integers(2, 50_000, int(rng.integers(100, 4000))).astype(np.int32)
        docs.append(doc)
        total += doc.size
    with CacheWriter(path) as writer:
        writer.write(docs)


def run(cache: str, jax_cache: str, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
        JAX_COMPILATION_CACHE_DIR=jax_cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, __file__, "--child", cache], env=env, capture_output=True, text=True, timeout=1200
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    line = [row for row in done.stdout.splitlines() if row.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def programs(events: list) -> list[tuple[str, str, float]]:
    """Per program, summed: (phase, function, seconds), longest first."""
    total: dict[tuple[str, str], float] = {}
    for name, fun, seconds in events:
        total[(name, fun)] = total.get((name, fun), 0.0) + seconds
    return sorted(((n, f, s) for (n, f), s in total.items()), key=lambda row: -row[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[], help="name=PYTHONPATH")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "bench_first_batch.json"))
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    variants = [("this", None)] + [tuple(v.split("=", 1)) for v in args.variant]
    root = tempfile.mkdtemp(prefix="bench_first_batch_")
    cache = os.path.join(root, "cache")
    write_cache(cache)
    results: dict[str, dict[str, list]] = {name: {"cold": [], "warm": []} for name, _ in variants}
    for rep in range(args.reps):
        order = variants if rep % 2 == 0 else variants[::-1]
        for name, path in order:
            jax_cache = tempfile.mkdtemp(dir=root)
            for side in ("cold", "warm"):
                result = run(cache, jax_cache, path)
                results[name][side].append(result)
                print(f"{name:8s} {side} rep {rep}: first batch {result['first_batch_s']:.2f} s "
                      f"({result['first_batch_cpu_s']:.2f} CPU-s, make {result['make_s']:.2f} s, "
                      f"misses {result['misses']}, hits {result['hits']})", flush=True)  # fmt: skip
    summary = {}
    for name, sides in results.items():
        for side, runs in sides.items():
            firsts = [r["first_batch_s"] for r in runs]
            summary[f"{name}/{side}"] = {
                "first_batch_median_s": statistics.median(firsts),
                "first_batch_range_s": [min(firsts), max(firsts)],
                "first_batch_cpu_median_s": statistics.median(r["first_batch_cpu_s"] for r in runs),
                "make_median_s": statistics.median(r["make_s"] for r in runs),
                "second_batch_median_s": statistics.median(r["second_batch_s"] for r in runs),
                "compiles": runs[0]["misses"],
                "programs": programs(runs[0]["events"])[:25],
            }
            row = summary[f"{name}/{side}"]
            print(f"{name}/{side}: first batch median {row['first_batch_median_s']:.2f} s "
                  f"range {min(firsts):.2f}-{max(firsts):.2f} s "
                  f"({row['first_batch_cpu_median_s']:.2f} CPU-s), "
                  f"second batch {row['second_batch_median_s'] * 1e3:.0f} ms, "
                  f"{runs[0]['misses']} compiles")  # fmt: skip
    checks = {r["checksum"] for sides in results.values() for runs in sides.values() for r in runs}
    assert len(checks) == 1, f"the variants made different batches: {checks}"
    with open(args.out, "w") as f:
        json.dump({"reps": args.reps, "variants": dict(variants), "summary": summary}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
