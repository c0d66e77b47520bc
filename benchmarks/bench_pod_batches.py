"""Pod-size batches: host time per step of 1024 x 4096 tokens on 1 and on 8 devices.

Method: one local cache (Zipf token ids, as ``bench_pipeline.py``), read by
``Pipeline(CausalLMDataset(cache, 4096, shuffle=block))`` through a ``BlockCache`` holding the
whole cache after a first pass (so what is timed is host work, not the disk). For each mesh (1
device, 8 virtual CPU devices) the same steps are made with ``pipeline.batch(step)`` (blocking)
in rounds that alternate the meshes; reported: median and [min, max] seconds per step over rounds
(each round's median over its steps), and the bytes each device receives. Batches on 8 devices are
checked equal to 1 device's, step by step.

    python benchmarks/bench_pod_batches.py [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import statistics
import tempfile
import time

import jax
import numpy as np
from harness import banner, write_json, write_zipf_cache

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import BlockCache, TokenCache

VOCAB = 32_768


def write_cache(path: str, tokens: int) -> None:
    write_zipf_cache(path, tokens, VOCAB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args()
    steps, rounds = (4, 2) if args.quick else (8, 3)
    payload = banner("bench_pod_batches")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cache")
        tokens = (steps + 1) * args.batch * args.seq_len
        write_cache(path, tokens)
        lru = BlockCache(2 * tokens * 4, block_tokens=256 * args.seq_len)
        pipelines = {}
        for devices in (1, 8):
            mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
            cache = TokenCache.open(path, block_cache=lru)
            spec = ShuffleSpec("block", io_block_size=256, window_blocks=4)
            dataset = CausalLMDataset(cache, args.seq_len, shuffle=spec)
            pipelines[devices] = Pipeline(dataset, mesh=mesh, batch_size=args.batch, key=0)
        reference = {}
        for step in range(steps):  # compiles, fills the block cache, checks 8 devices == 1 device
            reference[step] = np.asarray(pipelines[1].batch(step).tokens)
            got = np.asarray(pipelines[8].batch(step).tokens)
            np.testing.assert_array_equal(got, reference[step])
        print(f"{args.batch} x {args.seq_len}: batches on 8 devices equal 1 device's ({steps} steps)")
        per_round = {d: [] for d in pipelines}
        for r in range(rounds):
            for devices in (1, 8) if r % 2 == 0 else (8, 1):
                times = []
                for step in range(steps):
                    began = time.perf_counter()
                    jax.block_until_ready(pipelines[devices].batch(step))
                    times.append(time.perf_counter() - began)
                per_round[devices].append(statistics.median(times))
        table = {}
        for devices, values in per_round.items():
            table[devices] = {
                "median_s": statistics.median(values),
                "min_s": min(values),
                "max_s": max(values),
                "mb_per_device": args.batch // devices * args.seq_len * 4 * 3 / 1e6,  # 3 int32 leaves
            }
            row = table[devices]
            print(
                f"{devices} device(s): {row['median_s'] * 1e3:.0f} ms per step "
                f"[{row['min_s'] * 1e3:.0f}, {row['max_s'] * 1e3:.0f}], "
                f"{row['mb_per_device']:.1f} MB per device"
            )
        payload.update(args=vars(args), steps=steps, rounds=rounds, table=table)
        write_json(__file__, payload)


if __name__ == "__main__":
    main()
