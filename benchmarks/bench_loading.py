"""Loading benchmark: host read throughput of meshbatch's TokenCache against Levanter's TokenSeqDataset.

What is compared, on one local cache (written once in Levanter's format) in one run:

- access patterns over ``seq_len``-token examples: ``sequential``; ``full`` (Feistel permutation);
  ``era`` (era shuffle); ``block`` (two-level block shuffle, ``io_block_size`` examples per block,
  ``window_blocks`` blocks per window), each at batch sizes 64 and 2048;
- ours: ``meshbatch.permutation`` / ``era_shuffle`` / ``block_shuffle`` (``compat="levanter"``, so
  the physical example order is Levanter's) mapping logical to physical indices in a jitted call,
  then ``TokenCache.read_spans`` (coalesced: one TensorStore read per run, all in one ``ts.Batch``);
  block rows keep a ``BlockCache`` of two windows when a batch is smaller than a window;
- Levanter: ``TokenSeqDataset(TreeCache.load(...), seq_len)`` wrapped in ``PermutationDataset`` /
  ``EraShufflingDataset`` (Levanter 1.2.dev1644 has no block shuffle: its block rows call
  ``TokenSeqDataset.get_batch`` with the same block-shuffled physical indices ours read), called
  through ``get_batch`` (asyncio) with the same logical indices; its reads are counted by wrapping
  its data array (one read per example, by its code);
- ceiling: the raw contiguous read rate, the whole data array read front to back (``raw_ceiling``).

Method: both sides open the cache afresh for every repetition with the same TensorStore cache pool
(``10**9`` bytes, Levanter's ``CACHE_BYTES_LIMIT``), read batch 0 as warm-up (jit compile, file
opens; its tokens from both sides must be identical), then time batches ``1..k`` (to the end of one
epoch, at most ``--max-batches``). Repetitions alternate between the sides, so a load spike on a
shared machine hits both. tokens/s = timed tokens / wall time; the median of ``--repeats``
repetitions is reported. reads/example = TensorStore reads issued / examples read in timed batches.
Absolute numbers only mean something on the machine that made them; the ratios are the result.

    python benchmarks/bench_loading.py           # 16384 examples x 4096 tokens (256 MiB int32)
    python benchmarks/bench_loading.py --quick   # 4096 examples, 1 repetition
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from meshbatch.cache import DEFAULT_CHUNK_SIZE, BlockCache, CacheWriter, TokenCache
from meshbatch.cache.format.arrays import open_field
from meshbatch.cache.format.ledger import try_read_ledger

LEVANTER_CACHE_POOL_BYTES = 10**9  # levanter.store.jagged_array.CACHE_BYTES_LIMIT's default
HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Pattern:
    """One access pattern: how logical example indices map to physical ones."""

    name: str
    kind: str  # "sequential" | "full" | "era" | "block"
    era_length: int = 0
    io_block_size: int = 0
    window_blocks: int = 0


def build_cache(path: str, *, examples: int, seq_len: int, seed: int = 0) -> None:
    """Writes ``examples * seq_len`` random tokens as documents of 100..8000 tokens (reused if present)."""
    metadata = {"bench_loading": {"examples": examples, "seq_len": seq_len, "seed": seed}}
    existing = try_read_ledger(path)
    if (
        existing is not None
        and existing.is_finished
        and existing.metadata == {"preprocessor_metadata": metadata}
    ):
        return
    rng = np.random.default_rng(seed)
    total = examples * seq_len
    tokens = rng.integers(0, 50_257, size=total, dtype=np.int32)
    cuts = np.cumsum(rng.integers(100, 8000, size=total // 100))
    cuts = np.concatenate([[0], cuts[cuts < total], [total]])
    with CacheWriter(path, if_exists="overwrite", metadata=metadata, flush_tokens=total) as writer:
        writer.write(tokens[a:b] for a, b in itertools.pairwise(cuts.tolist()))


@jax.jit
def _apply(shuffle, indices):
    return shuffle(indices)


def make_shuffle(pattern: Pattern, n: int, key):
    """``indices -> physical indices`` (numpy uint32 in, numpy int64 out) via meshbatch's jitted shuffles."""
    if pattern.kind == "sequential":
        return lambda idx: idx.astype(np.int64)
    import meshbatch  # the shuffles live on branch main (meshbatch.permutation / era_shuffle / block_shuffle)

    if pattern.kind == "full":
        shuffle = meshbatch.permutation("feistel", n, key, compat="levanter")
    elif pattern.kind == "era":
        shuffle = meshbatch.era_shuffle(n, era_length=pattern.era_length, key=key, compat="levanter")
    else:
        shuffle = meshbatch.block_shuffle(
            n,
            io_block_size=pattern.io_block_size,
            window_blocks=pattern.window_blocks,
            key=key,
            compat="levanter",
        )
    return lambda idx: np.asarray(_apply(shuffle, jnp.asarray(idx, dtype=jnp.uint32))).astype(np.int64)


class _CountingArray:
    """Wraps Levanter's data TensorStore to count the reads its ``TokenSeqDataset`` issues."""

    def __init__(self, array):
        self.array, self.reads = array, 0

    def __getitem__(self, item):
        sliced = self.array[item]
        outer = self

        class _Read:
            def read(self, **kwargs):
                outer.reads += 1
                return sliced.read(**kwargs)

        return _Read()


def uses_block_cache(pattern: Pattern, batch: int) -> bool:
    """Block rows keep a block cache when a batch is smaller than a window: later batches revisit it."""
    return pattern.kind == "block" and batch < pattern.io_block_size * pattern.window_blocks


def ours_reader(pattern: Pattern, args, batch: int, shuffle):
    """``get(b) -> [batch, seq_len]`` through a freshly opened TokenCache, and its read counter."""
    context = ts.Context({"cache_pool": {"total_bytes_limit": LEVANTER_CACHE_POOL_BYTES}})
    lru = None
    if uses_block_cache(pattern, batch):  # two windows of decoded chunks
        window_tokens = pattern.io_block_size * pattern.window_blocks * args.seq_len
        lru = BlockCache(2 * window_tokens * 4, block_tokens=DEFAULT_CHUNK_SIZE)
    cache = TokenCache.open(args.cache, context=context, block_cache=lru)

    def get(b: int) -> np.ndarray:
        physical = shuffle(np.arange(b * batch, (b + 1) * batch, dtype=np.uint32))
        return cache.read_spans(physical * args.seq_len, args.seq_len).tokens.reshape(batch, args.seq_len)

    return get, lambda: cache.counters.reads_issued


def levanter_reader(pattern: Pattern, args, batch: int, shuffle, key, loop):
    """``get(b)`` through Levanter's dataset for ``pattern`` over a fresh ``TreeCache.load``."""
    from levanter.data.permutation import EraShufflingDataset, PermutationDataset
    from levanter.data.text import TokenSeqDataset
    from levanter.store.cache import TreeCache

    cache = TreeCache.load(args.cache, {"input_ids": np.zeros((0,), np.int32)})
    counter = _CountingArray(cache.store.tree["input_ids"].data)
    cache.store.tree["input_ids"].data = counter
    dataset = TokenSeqDataset(cache, args.seq_len)
    if pattern.kind == "full":
        dataset = PermutationDataset(dataset, key)
    elif pattern.kind == "era":
        dataset = EraShufflingDataset(dataset, pattern.era_length, key=key)

    def get(b: int) -> np.ndarray:
        indices = np.arange(b * batch, (b + 1) * batch, dtype=np.uint32)
        if pattern.kind == "block":  # no Levanter block shuffle: the physical indices ours read
            indices = shuffle(indices)
        return np.stack(loop.run_until_complete(dataset.get_batch(indices.tolist())))

    return get, lambda: counter.reads


def measure(pattern: Pattern, args, batch: int, key) -> dict:
    """Both sides, repetitions interleaved (ours, Levanter, ours, ...) so load drift hits both alike.

    Returns per side: median tokens/s, reads/example of the timed batches, and the warm-up batch.
    """
    shuffle = make_shuffle(pattern, args.examples, key)
    timed = range(1, min(args.examples // batch, args.max_batches + 1))
    loop = asyncio.new_event_loop()
    out = {side: {"rates": [], "reads": 0, "first": None} for side in ("ours", "levanter")}
    for _ in range(args.repeats):
        for side, got in out.items():
            if side == "ours":
                get, count = ours_reader(pattern, args, batch, shuffle)
            else:
                get, count = levanter_reader(pattern, args, batch, shuffle, key, loop)
            got["first"] = get(0)  # warm-up: jit, file opens; compared across sides below
            before = count()
            start = time.perf_counter()
            for b in timed:
                get(b)
            got["rates"].append(len(timed) * batch * args.seq_len / (time.perf_counter() - start))
            got["reads"] = count() - before
    loop.close()
    return {
        side: {
            "tokens_per_s": statistics.median(got["rates"]),
            "reads_per_example": got["reads"] / (len(timed) * batch),
            "first": got["first"],
        }
        for side, got in out.items()
    }


def raw_ceiling(args) -> float:
    """Tokens/s of reading the whole data array front to back, one contiguous read at a time.

    Reads are chunk-aligned 1Mi-token ranges (4 zarr read chunks): TensorStore's fastest contiguous
    pattern on this cache (single reads of 8Mi tokens or more run several times slower). One untimed
    pass first, so every repetition finds the files in the page cache.
    """
    step, total, rates = 4 * DEFAULT_CHUNK_SIZE, args.examples * args.seq_len, []
    for rep in range(args.repeats + 1):
        context = ts.Context({"cache_pool": {"total_bytes_limit": LEVANTER_CACHE_POOL_BYTES}})
        data = open_field(args.cache, "input_ids", context=context).data
        start = time.perf_counter()
        for lo in range(0, total, step):
            data[lo : min(lo + step, total)].read().result()
        if rep:
            rates.append(total / (time.perf_counter() - start))
    return statistics.median(rates)


def format_table(rows: list[dict]) -> str:
    """The rows as a markdown table (pasted into RESULTS.md)."""
    columns = ["pattern", "batch", "block cache", "ours tok/s", "Levanter tok/s", "ours / Levanter"]
    columns += [
        "ours reads/ex",
        "Levanter reads/ex",
        "ours / ceiling",
        "Levanter / ceiling",
        "ours / Levanter full",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [r["name"], str(r["batch"]), "yes" if r["block_cache"] else "no"]
        cells += [f"{r['ours_tokens_per_s'] / 1e6:.1f} M", f"{r['levanter_tokens_per_s'] / 1e6:.1f} M"]
        cells += [f"{r['ratio_vs_levanter']:.1f}x", f"{r['ours_reads_per_example']:.4f}"]
        cells += [f"{r['levanter_reads_per_example']:.4f}", f"{r['ours_vs_ceiling']:.2f}"]
        cells += [f"{r['levanter_vs_ceiling']:.2f}"]
        cells += ["-" if r["ratio_vs_levanter_full"] is None else f"{r['ratio_vs_levanter_full']:.1f}x"]
        lines.append("| " + " | ".join(cells) + " |" + ("" if r["tokens_match"] else "  TOKENS DIFFER"))
    return "\n".join(lines)


def patterns(args) -> list[Pattern]:
    out = [
        Pattern("sequential", "sequential"),
        Pattern("full", "full"),
        Pattern("era", "era", era_length=args.era_length),
    ]
    for io in args.io_block_sizes:
        out.append(
            Pattern(
                f"block(io={io},w={args.window_blocks})",
                "block",
                io_block_size=io,
                window_blocks=args.window_blocks,
            )
        )
    return [p for p in out if p.kind in args.patterns]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4096 examples, 1 repetition")
    parser.add_argument("--examples", type=int, default=16384)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[64, 2048])
    parser.add_argument("--era-length", type=int, default=1024)
    parser.add_argument("--io-block-sizes", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--window-blocks", type=int, default=8)
    parser.add_argument(
        "--patterns", type=lambda s: s.split(","), default=["sequential", "full", "era", "block"]
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-batches", type=int, default=32, help="timed batches per repetition, at most")
    parser.add_argument("--cache", default=None, help="cache directory (default: a temp dir per size)")
    parser.add_argument("--out", default=os.path.join(HERE, "bench_loading.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.repeats = 4096, 1
    if args.io_block_sizes is None:  # chunk-aligned: one zarr read chunk per block, and two
        args.io_block_sizes = [DEFAULT_CHUNK_SIZE // args.seq_len, 2 * DEFAULT_CHUNK_SIZE // args.seq_len]
    args.cache = args.cache or os.path.join("/tmp", f"meshbatch-bench-loading-{args.examples}x{args.seq_len}")
    build_cache(args.cache, examples=args.examples, seq_len=args.seq_len)

    key = jax.random.PRNGKey(0)
    device = jax.devices()[0]
    print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}); {os.cpu_count()} CPUs")
    print(f"cache {args.cache}: {args.examples} examples x {args.seq_len} tokens, int32")
    ceiling = raw_ceiling(args)
    print(f"raw contiguous read ceiling: {ceiling / 1e6:.1f} M tokens/s\n")
    rows = []
    for pattern in patterns(args):
        for batch in args.batch_sizes:
            print(f"measuring {pattern.name}, batch {batch} ...", flush=True)
            measured = measure(pattern, args, batch, key)
            ours, theirs = measured["ours"], measured["levanter"]
            rows.append(
                {
                    **asdict(pattern),
                    "batch": batch,
                    "block_cache": uses_block_cache(pattern, batch),
                    "ours_tokens_per_s": ours["tokens_per_s"],
                    "levanter_tokens_per_s": theirs["tokens_per_s"],
                    "ratio_vs_levanter": ours["tokens_per_s"] / theirs["tokens_per_s"],
                    "ours_reads_per_example": ours["reads_per_example"],
                    "levanter_reads_per_example": theirs["reads_per_example"],
                    "ours_vs_ceiling": ours["tokens_per_s"] / ceiling,
                    "levanter_vs_ceiling": theirs["tokens_per_s"] / ceiling,
                    "tokens_match": bool(np.array_equal(ours["first"], theirs["first"])),
                }
            )
    for row in rows:  # the acceptance comparison: against Levanter's Feistel PermutationDataset
        full = next((r for r in rows if r["kind"] == "full" and r["batch"] == row["batch"]), None)
        row["ratio_vs_levanter_full"] = (
            row["ours_tokens_per_s"] / full["levanter_tokens_per_s"] if full else None
        )
    print()
    print(format_table(rows))
    result = {
        "jax": jax.__version__,
        "device": f"{device.platform} ({device.device_kind})",
        "cpus": os.cpu_count(),
        "examples": args.examples,
        "seq_len": args.seq_len,
        "repeats": args.repeats,
        "max_batches": args.max_batches,
        "raw_ceiling_tokens_per_s": ceiling,
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.out}")
    return result


if __name__ == "__main__":
    main()
