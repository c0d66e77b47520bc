"""End-to-end loading: a local token cache into sharded ``[batch, seq_len]`` batches.

Method: one cache (written once by Levanter's ``SerialCacheWriter``), read by both loaders in the
same process on the same mesh, one after the other:

* Levanter: ``DataLoader(PermutationDataset(TokenSeqDataset(cache, seq_len), key), batch)`` (its
  Feistel permutation), iterated with its own background prefetch;
* meshbatch: ``Pipeline(CausalLMDataset(cache, seq_len, shuffle))`` iterated with ``iterate_from``,
  with the full permutation in Levanter mode (same batches as Levanter, checked) and the block
  shuffle (strong default).

Each loader runs ``--warmup`` steps (compiles, first reads), then is timed over ``--steps`` steps,
each batch ``block_until_ready``; tokens/s = steps * batch * seq_len / time. Reported for 1 and 8
virtual CPU devices. Then the consumer-wait check: a jitted stand-in for a training step that takes
about twice the loader's step time consumes meshbatch's batches; with a steady prefetch the
consumer should (almost) never wait, and ``ready`` shows how many batches were queued each time.

    python benchmarks/bench_pipeline.py [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import tempfile
import time

import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
from harness import banner, write_json
from levanter.data.loader import DataLoader
from levanter.data.permutation import PermutationDataset
from levanter.data.text import TokenSeqDataset
from levanter.store.cache import SerialCacheWriter, TreeCache

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache

EXEMPLAR = {"input_ids": np.zeros(0, np.int32)}


def write_cache(path: str, tokens: int) -> None:
    rng = np.random.default_rng(0)
    with SerialCacheWriter(path, EXEMPLAR) as writer:
        written = 0
        while written < tokens:
            docs = [rng.integers(0, 50_000, rng.integers(500, 20_000)).astype(np.int32) for _ in range(64)]
            writer.write_batch([{"input_ids": doc} for doc in docs])
            written += sum(doc.size for doc in docs)


def time_stream(stream, steps: int, warmup: int) -> tuple[float, list]:
    for _ in range(warmup):
        jax.block_until_ready(next(stream))
    start = time.perf_counter()
    last = None
    for _ in range(steps):
        last = next(stream)
        jax.block_until_ready(last)
    return time.perf_counter() - start, last


def levanter_run(path, seq_len, batch, mesh, key, steps, warmup):
    dataset = PermutationDataset(TokenSeqDataset(TreeCache.load(path, EXEMPLAR), seq_len), key)
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        loader = DataLoader(dataset, batch, mesh=mesh, axis_resources={"batch": "data"})
        stream = iter(loader)
        seconds, _ = time_stream(stream, steps, warmup)
        check = [np.asarray(b) for b in _take(iter(loader), 2)]
    return seconds, check


def _take(it, n):
    return [next(it) for _ in range(n)]


def meshbatch_run(path, seq_len, batch, mesh, key, spec, steps, warmup):
    pipeline = Pipeline(
        CausalLMDataset(TokenCache.open(path), seq_len, shuffle=spec), mesh=mesh, batch_size=batch, key=key
    )
    stream = pipeline.iterate_from(0)
    seconds, _ = time_stream(stream, steps, warmup)
    stats = stream.stats()
    stream.close()
    return seconds, pipeline, stats


def consumer_wait(pipeline, step_seconds: float, steps: int) -> dict:
    """Consume batches with a jitted step that takes about ``step_seconds``; report the waits."""
    size = 256

    @jax.jit
    def train_step(tokens, weights):
        x = jnp.tanh(tokens[:, :size].astype(jnp.float32) * 1e-4)
        for _ in range(4):
            x = jnp.tanh(x @ weights)
        return x.sum()

    weights = jnp.eye(size, dtype=jnp.float32)
    sample = pipeline.batch(0).tokens
    train_step(sample, weights).block_until_ready()
    per_call = min(_timed(lambda: train_step(sample, weights).block_until_ready()) for _ in range(5))
    repeats = max(1, round(step_seconds / max(per_call, 1e-6)))
    stream = pipeline.iterate_from(0)
    time.sleep(0.5)  # let the queue fill once, as it would during the first training step's compile
    for _ in range(steps):
        batch = next(stream)
        for _ in range(repeats):
            train_step(batch.tokens, weights).block_until_ready()
    stats = stream.stats()
    stream.close()
    return {"simulated_step_s": per_call * repeats, **stats}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller cache and fewer steps")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    env = banner("bench_pipeline")
    steps, warmup = (8, 2) if args.quick else (30, 3)
    tokens = (steps + warmup + 4) * args.batch * args.seq_len * 2
    key = jax.random.PRNGKey(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cache")
        write_cache(path, tokens)
        print(f"cache: {tokens / 1e6:.0f}M tokens, seq_len={args.seq_len}, batch={args.batch}, steps={steps}")
        header = f"{'devices':>7} {'loader':<44} {'tokens/s':>12} {'vs levanter':>11} {'wait/batch':>11}"
        print(header)
        print("-" * len(header))
        for devices in (1, 8):
            mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
            base, levanter_batches = levanter_run(path, args.seq_len, args.batch, mesh, key, steps, warmup)
            per_token = steps * args.batch * args.seq_len
            results = {"levanter DataLoader + PermutationDataset (feistel)": (base, None)}
            for label, spec in (
                ("meshbatch full permutation, compat=levanter", ShuffleSpec("full", compat="levanter")),
                ("meshbatch block shuffle (strong default)", ShuffleSpec("block")),
            ):
                seconds, pipeline, stats = meshbatch_run(
                    path, args.seq_len, args.batch, mesh, key, spec, steps, warmup
                )
                results[label] = (seconds, stats)
                if spec.compat == "levanter":
                    for step, want in enumerate(levanter_batches):
                        np.testing.assert_array_equal(np.asarray(pipeline.batch(step).tokens), want)
            for label, (seconds, stats) in results.items():
                rate = per_token / seconds
                wait = "" if stats is None else f"{stats['wait_mean_s'] * 1e3:9.1f}ms"
                print(f"{devices:>7} {label:<44} {rate:>12.3e} {base / seconds:>10.1f}x {wait:>11}")
                rows.append(
                    {
                        "devices": devices,
                        "loader": label,
                        "seconds": seconds,
                        "tokens_per_s": rate,
                        "ratio_vs_levanter": base / seconds,
                        "prefetch": stats,
                    }
                )
        loader_step = min(r["seconds"] for r in rows if r["devices"] == 8 and r["prefetch"]) / steps
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
        pipeline = Pipeline(
            CausalLMDataset(TokenCache.open(path), args.seq_len, shuffle=ShuffleSpec("block")),
            mesh=mesh,
            batch_size=args.batch,
            key=key,
        )
        wait = consumer_wait(pipeline, 2 * loader_step, steps)
        print(
            f"\nconsumer wait with a {wait['simulated_step_s'] * 1e3:.0f}ms training step (8 devices, block "
            f"shuffle, prefetch {pipeline.prefetch}): mean {wait['wait_mean_s'] * 1e3:.2f}ms, "
            f"p95 {wait['wait_p95_s'] * 1e3:.2f}ms, max {wait['wait_max_s'] * 1e3:.2f}ms; "
            f"batches ready when asked: mean {wait['ready_mean']:.1f}, min {wait['ready_min']:.0f}"
        )
    write_json(__file__, {"env": env, "args": vars(args), "rows": rows, "consumer_wait": wait})


if __name__ == "__main__":
    main()
