"""End-to-end loading: a local token cache into sharded ``[batch, seq_len]`` batches.

Method: one cache written once by Levanter's ``SerialCacheWriter`` (Zipf-distributed token ids,
exponent 1.2 over a 32K vocabulary, so blosc compresses it like real text; documents of 500 to
20,000 tokens), read by every loader in the same process on the same mesh:

* Levanter ``DataLoader`` over ``PermutationDataset(TokenSeqDataset(cache, seq_len), key)`` (its
  Feistel permutation): raw token windows, and the LM-training path that wraps the windows in
  ``CausalLmDataset`` (``LmExample`` with loss mask and attention mask);
* meshbatch ``Pipeline(CausalLMDataset(...))`` (tokens, loss mask, segment ids): the full
  permutation in Levanter mode (its batches are checked equal to Levanter's), and the block shuffle
  (strong default, chunk-aligned blocks, window 8) reading through a host block cache;
* meshbatch ``Pipeline(SpliceLMDataset.from_cache(..., pool=False))``: splice frames of the 64
  longest documents (coverage-balanced starts, jitter, a per-epoch shuffle) with every row's span
  fetched from the cache (ragged spans: the path with no whole-row windows).

Each loader is first run for a few batches (compiles, warms the OS page cache), then a fresh
iterator is timed from its creation through ``--steps`` batches, each ``block_until_ready``:
tokens/s = steps * batch * seq_len / time. ``--steps`` is several times Levanter's 64-batch buffer,
so what is timed is the sustained rate, not a pre-filled queue. Reported for 1 and 8 virtual CPU
devices. Then the consumer-wait check: a jitted stand-in for a training step taking about twice
the loader's step time consumes meshbatch's batches; with a steady prefetch the consumer should
(almost) never wait, and ``ready`` shows how many batches were queued each time it asked.

    python benchmarks/bench_pipeline.py [--quick] [--ours-only]

``--ours-only`` times only meshbatch's loaders (for before/after comparisons of the pipeline).
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
from levanter.data.text import CausalLmDataset, TokenSeqDataset
from levanter.store.cache import SerialCacheWriter, TreeCache

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec, SpliceLMDataset, select_documents
from meshbatch.cache import BlockCache, TokenCache

EXEMPLAR = {"input_ids": np.zeros(0, np.int32)}
VOCAB = 32_768


def write_cache(path: str, tokens: int) -> None:
    rng = np.random.default_rng(0)
    with SerialCacheWriter(path, EXEMPLAR) as writer:
        written = 0
        while written < tokens:
            docs = [
                np.minimum(rng.zipf(1.2, rng.integers(500, 20_000)), VOCAB - 1).astype(np.int32)
                for _ in range(64)
            ]
            writer.write_batch([{"input_ids": doc} for doc in docs])
            written += sum(doc.size for doc in docs)


def sustained(make_iterator, steps: int, warmup: int) -> float:
    """Seconds for ``steps`` batches from a fresh iterator (after a separate warm-up iterator)."""
    warm = make_iterator()
    for _ in range(warmup):
        jax.block_until_ready(next(warm))
    close = getattr(warm, "close", None)
    if close:
        close()
    del warm
    start = time.perf_counter()
    stream = make_iterator()
    for _ in range(steps):
        jax.block_until_ready(next(stream))
    seconds = time.perf_counter() - start
    if getattr(stream, "close", None):
        stream.close()
    return seconds


def levanter_loader(path, seq_len, batch, mesh, key, *, lm_examples: bool):
    dataset = PermutationDataset(TokenSeqDataset(TreeCache.load(path, EXEMPLAR), seq_len), key)
    if lm_examples:
        dataset = CausalLmDataset(dataset, hax.Axis("position", seq_len))

    def make():
        with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
            return iter(DataLoader(dataset, batch, mesh=mesh, axis_resources={"batch": "data"}))

    return make


def meshbatch_pipelines(path, args, mesh, key, block_cache_bytes):
    """``(label, Pipeline)`` for each meshbatch loader timed (see the module docstring)."""
    variants = (
        ("meshbatch full permutation, compat=levanter", ShuffleSpec("full", compat="levanter"), None),
        ("meshbatch block shuffle + block cache", ShuffleSpec("block", window_blocks=8), block_cache_bytes),
    )
    for label, spec, block_bytes in variants:
        cache = TokenCache.open(path, block_cache=None if block_bytes is None else BlockCache(block_bytes))
        dataset = CausalLMDataset(cache, args.seq_len, shuffle=spec)
        yield label, Pipeline(dataset, mesh=mesh, batch_size=args.batch, key=key)
    cache = TokenCache.open(path)
    selection = select_documents(cache.doc_lengths(), num_docs=64, doc_select_mode="longest")
    splice = SpliceLMDataset.from_cache(
        cache,
        selection.indices,
        pool=False,
        seq_len=args.seq_len,
        content_length=args.seq_len * 3 // 4,
        content_start_mode="coverage_balanced",
        offset_jitter=64,
        jitter_mode="low_discrepancy",
        shuffle_per_epoch=True,
        pad_token_id=0,
    )
    yield (
        "meshbatch splice fetch (64 docs, coverage-balanced)",
        Pipeline(splice, mesh=mesh, batch_size=args.batch, key=key),
    )


def consumer_wait(pipeline: Pipeline, step_seconds: float, steps: int) -> dict:
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
    start = time.perf_counter()
    for _ in range(5):
        train_step(sample, weights).block_until_ready()
    per_call = (time.perf_counter() - start) / 5
    repeats = max(1, round(step_seconds / max(per_call, 1e-6)))
    stream = pipeline.iterate_from(0)
    jax.block_until_ready(next(stream))  # the first batch includes the pipeline's compile
    stream.reset_stats()
    for _ in range(steps):
        batch = next(stream)
        for _ in range(repeats):
            train_step(batch.tokens, weights).block_until_ready()
    stats = stream.stats()
    stream.close()
    return {"simulated_step_s": per_call * repeats, **stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller cache and fewer steps")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--ours-only", action="store_true", help="time only meshbatch's loaders")
    args = parser.parse_args()
    env = banner("bench_pipeline")
    steps, warmup = (30, 3) if args.quick else (200, 5)
    tokens = (steps + warmup + 8) * args.batch * args.seq_len
    key = jax.random.PRNGKey(0)
    block_cache_bytes = 2 * 8 * 256 * 1024 * 4  # two windows of 8 one-chunk blocks
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cache")
        write_cache(path, tokens)
        print(f"cache: {tokens / 1e6:.0f}M Zipf tokens, seq_len={args.seq_len}, batch={args.batch}")
        print(f"timed: {steps} batches per loader from a fresh iterator")
        header = f"{'devices':>7} {'loader':<58} {'tokens/s':>12} {'vs levanter':>11}"
        print(header)
        print("-" * len(header))
        per_run = steps * args.batch * args.seq_len
        for devices in (1, 8):
            mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
            results = {}
            if not args.ours_only:
                for label, lm in (
                    ("levanter DataLoader, PermutationDataset (tokens)", False),
                    ("levanter DataLoader, PermutationDataset -> LmExample", True),
                ):
                    results[label] = sustained(
                        levanter_loader(path, args.seq_len, args.batch, mesh, key, lm_examples=lm),
                        steps,
                        warmup,
                    )
                check = levanter_loader(path, args.seq_len, args.batch, mesh, key, lm_examples=False)()
                levanter_batches = [np.asarray(next(check)) for _ in range(3)]
            for label, pipeline in meshbatch_pipelines(path, args, mesh, key, block_cache_bytes):
                if "compat=levanter" in label and not args.ours_only:
                    for step, want in enumerate(levanter_batches):
                        np.testing.assert_array_equal(np.asarray(pipeline.batch(step).tokens), want)
                results[label] = sustained(lambda p=pipeline: p.iterate_from(0), steps, warmup)
            base = results.get("levanter DataLoader, PermutationDataset (tokens)")
            lm_base = results.get("levanter DataLoader, PermutationDataset -> LmExample")
            for label, seconds in results.items():
                rate = per_run / seconds
                ratio = f"{base / seconds:>10.1f}x" if base else f"{'-':>11}"
                print(f"{devices:>7} {label:<58} {rate:>12.3e} {ratio}")
                rows.append(
                    {
                        "devices": devices,
                        "loader": label,
                        "seconds": seconds,
                        "tokens_per_s": rate,
                        "ratio_vs_levanter_tokens": base / seconds if base else None,
                        "ratio_vs_levanter_lm": lm_base / seconds if lm_base else None,
                    }
                )
        loader_step = (
            min(r["seconds"] for r in rows if r["devices"] == 8 and "meshbatch" in r["loader"]) / steps
        )
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
        cache = TokenCache.open(path, block_cache=BlockCache(block_cache_bytes))
        pipeline = Pipeline(
            CausalLMDataset(cache, args.seq_len, shuffle=ShuffleSpec("block")),
            mesh=mesh,
            batch_size=args.batch,
            key=key,
        )
        wait = consumer_wait(pipeline, 2 * loader_step, min(steps, 60))
        print(
            f"\nconsumer wait with a {wait['simulated_step_s'] * 1e3:.1f}ms training step (8 devices, block "
            f"shuffle, prefetch {pipeline.prefetch}, {wait['batches']} batches): mean "
            f"{wait['wait_mean_s'] * 1e3:.2f}ms, p95 {wait['wait_p95_s'] * 1e3:.2f}ms, max "
            f"{wait['wait_max_s'] * 1e3:.2f}ms; batches ready when asked: mean {wait['ready_mean']:.1f}, "
            f"min {wait['ready_min']:.0f}"
        )
    write_json(__file__, {"env": env, "args": vars(args), "rows": rows, "consumer_wait": wait})


if __name__ == "__main__":
    main()
