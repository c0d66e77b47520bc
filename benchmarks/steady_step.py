"""One steady step figure of a stable mixture of block-shuffled sources, for A/B runs of two trees.

Opens the first ``--sources`` caches that ``bench_scale.write_caches`` made under ``--data``, each
through one shared ``BlockCache(--block-cache)``, mixes ``CausalLMDataset(..., 1024,
shuffle=ShuffleSpec("block"))`` children with equal weights (``block_size=2048``), makes a
``Pipeline`` of 256 rows on 8 virtual CPU devices and times ``--steps`` batches of one stream
after ``--skip`` untimed ones (each taken as soon as the last is in hand). Run it from each tree's
own virtual environment, alternating the trees:

    .venv/bin/python benchmarks/steady_step.py --sources 256 --data /tmp/scale/data
"""

import argparse
import os
import statistics
import time

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_PLATFORMS"] = "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=64)
    parser.add_argument("--data", required=True, help="where bench_scale.write_caches put the caches")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--skip", type=int, default=64)
    parser.add_argument("--block-cache", type=int, default=2 << 30)
    args = parser.parse_args()

    import jax
    import numpy as np

    from meshbatch import CausalLMDataset, Mixture, Pipeline, ShuffleSpec
    from meshbatch.cache import BlockCache, TokenCache

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    shared = BlockCache(args.block_cache)
    names = [f"s{i:03d}" for i in range(args.sources)]
    kids = {
        name: CausalLMDataset(
            TokenCache.open(os.path.join(args.data, name), block_cache=shared),
            1024,
            shuffle=ShuffleSpec("block"),
        )
        for name in names
    }
    pipeline = Pipeline(
        Mixture(kids, dict.fromkeys(names, 1.0), block_size=2048), mesh=mesh, batch_size=256, key=0
    )
    stream = pipeline.iterate_from(0)
    for _ in range(args.skip):
        jax.block_until_ready(next(stream))
    waits, cpu, total = [], time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        start = time.perf_counter()
        jax.block_until_ready(next(stream))
        waits.append(time.perf_counter() - start)
    total, cpu = time.perf_counter() - total, time.process_time() - cpu
    stream.close()
    print(
        f"sources={args.sources} step_ms={1e3 * total / args.steps:.2f} "
        f"median_ms={1e3 * statistics.median(waits):.2f} cpu_ms={1e3 * cpu / args.steps:.2f}"
    )


if __name__ == "__main__":
    main()
