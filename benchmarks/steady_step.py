"""One steady step figure of a stable mixture of block-shuffled sources, for A/B runs of two trees.

``bench_scale.py``'s stable cell through one shared ``BlockCache(--block-cache)`` (its
``_meshbatch``: ``CausalLMDataset(..., 1024, shuffle=ShuffleSpec("block"))`` children of the first
``--sources`` caches under ``--data``, equal weights, 256 rows on 8 virtual CPU devices), in this
process and without the cold/warm runs: ``--steps`` batches of one stream timed after ``--skip``
untimed ones. Run it from each tree's own virtual environment, alternating the trees:

    .venv/bin/python benchmarks/steady_step.py --sources 256 --data /tmp/scale/data
"""

import argparse
import os
import statistics
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=64)
    parser.add_argument("--data", required=True, help="where bench_scale.write_caches put the caches")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--skip", type=int, default=64)
    parser.add_argument("--block-cache", type=int, default=2 << 30)
    args = parser.parse_args()
    args.kind, args.seq_len, args.batch = "stable", 1024, 256

    import jax
    import numpy as np

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    names = [f"s{i:03d}" for i in range(args.sources)]
    paths = [os.path.join(args.data, name) for name in names]
    make, batches = bench_scale._meshbatch(paths, names, args, mesh)
    stream = batches(make(), 0)
    for _ in range(args.skip):
        jax.block_until_ready(next(stream))
    waits, total, cpu = bench_scale.time_steps(stream, args.steps)
    stream.close()
    print(
        f"sources={args.sources} step_ms={1e3 * total / args.steps:.2f} "
        f"median_ms={1e3 * statistics.median(waits):.2f} cpu_ms={1e3 * cpu / args.steps:.2f}"
    )


if __name__ == "__main__":
    main()
