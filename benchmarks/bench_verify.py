"""The cost of verified reads: the same reads with verification on and off, paired, in one process.

A ``TokenCache`` of a cache meshbatch wrote checks what it reads against the writer's CRC-32s
(``meshbatch.cache.integrity.verify``): the offsets and the last data chunk at open, each data chunk on the
first read that touches it (the whole chunk is read in the same batch and summed; a verified chunk
costs nothing afterwards). ``verify=False`` (or ``MESHBATCH_VERIFY_READS=0``) turns that off.
Measured here, on one meshbatch-written cache of ``examples x seq_len`` random int32 tokens:

- open: ``TokenCache.open`` on and off, alternating (median of ``--repeats`` x 2 opens);
- reads: ``ab_loading.py``'s patterns (sequential, full, block) at batch 64 and 2048, each round a
  fresh open with a fresh TensorStore cache pool on both sides (who goes first alternates), then
  batches 1..k timed: a *first pass* (every chunk touched is verified during the timed reads: the
  worst case, an epoch's first visit of each chunk) and, on the same readers, a *second pass*
  over the same batches (verified chunks: the steady state). Reported: median tokens/s per side and
  the median of per-round ratios on / off, in wall time and in tokens per process CPU second (all
  threads: less sensitive to a loaded machine than wall time);
- a pipeline step: ``Pipeline(CausalLMDataset(cache, seq_len, full shuffle), batch 64)`` built
  afresh per round on each side, steps 1..k timed after step 0, then steps k+1..2k (median step
  time; the ratio is time on / time off, so above 1 is slower);
- a preblocked store (the cache's documents in blocks of 512): random batches of 256 blocks,
  its chunk checks on and off: the first batch after an open (it verifies most chunks) and later;
- one chunk's verification cost: its CRC-32 and one more decode (medians; less load-sensitive);
- ``validate_cache --deep`` MB/s on the same cache.

    python benchmarks/bench_verify.py            # 4096 x 4096 tokens (64 MiB, 64 chunks), 8 rounds
    python benchmarks/bench_verify.py --quick    # 1024 x 4096, 3 rounds
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np
import tensorstore as ts
from ab_loading import index_batches
from bench_loading import build_cache
from harness import banner, write_json

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache, validate_cache


def _open(path: str, verify: bool) -> TokenCache:
    return TokenCache.open(
        path, verify=verify, context=ts.Context({"cache_pool": {"total_bytes_limit": 10**9}})
    )


def _ratio(on: list[float], off: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(on, off, strict=True))


def reads(path: str, seq_len: int, rounds: int, batches: int) -> list[dict]:
    examples = TokenCache.open(path).num_tokens // seq_len
    rows = []
    print("| pattern | batch | pass | off tok/s | on tok/s | on / off | on / off, tokens per CPU second |")
    print("|---|---|---|---|---|---|---|")
    for pattern in ("sequential", "full", "block"):
        for batch in (64, 2048) if examples >= 4096 else (64, 512):
            order = index_batches(pattern, examples, batch, 128)
            timed = range(1, min(order.shape[0], batches + 1))
            rates = {(p, side): [] for p in ("first", "second") for side in ("on", "off")}
            cpu = {key: [] for key in rates}
            for r in range(rounds):
                sides = ("on", "off") if r % 2 == 0 else ("off", "on")
                caches = {}
                for side in sides:
                    caches[side] = _open(path, side == "on")
                    caches[side].read_spans(order[0] * seq_len, seq_len)  # warm-up, untimed
                for p in ("first", "second"):
                    for side in sides:
                        start, start_cpu = time.perf_counter(), time.process_time()
                        for b in timed:
                            caches[side].read_spans(order[b] * seq_len, seq_len)
                        tokens = len(timed) * batch * seq_len
                        rates[(p, side)].append(tokens / (time.perf_counter() - start))
                        cpu[(p, side)].append(tokens / max(time.process_time() - start_cpu, 1e-9))
            for p in ("first", "second"):
                on, off = rates[(p, "on")], rates[(p, "off")]
                row = {
                    "pattern": pattern,
                    "batch": batch,
                    "pass": p,
                    "off_tokens_per_s": statistics.median(off),
                    "on_tokens_per_s": statistics.median(on),
                    "on_over_off": _ratio(on, off),
                    "cpu_on_over_off": _ratio(cpu[(p, "on")], cpu[(p, "off")]),
                    "rounds": rounds,
                }
                rows.append(row)
                print(
                    f"| {pattern} | {batch} | {p} | {row['off_tokens_per_s'] / 1e6:.1f} M | "
                    f"{row['on_tokens_per_s'] / 1e6:.1f} M | {row['on_over_off']:.3f} | "
                    f"{row['cpu_on_over_off']:.3f} |",
                    flush=True,
                )
    return rows


def opens(path: str, repeats: int) -> dict:
    times = {"on": [], "off": []}
    for r in range(repeats):
        for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
            start = time.perf_counter()
            _open(path, side == "on")
            times[side].append(time.perf_counter() - start)
    row = {f"{side}_ms": statistics.median(t) * 1e3 for side, t in times.items()}
    print(f"open: off {row['off_ms']:.2f} ms, on {row['on_ms']:.2f} ms")
    return row


def pipeline_steps(path: str, seq_len: int, rounds: int, steps: int) -> dict:
    """Milliseconds per step, steps ``1..steps`` (chunks still being verified: an epoch's first
    visits) and ``steps+1..2*steps`` on the same pipeline (most chunks verified), per side."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    times = {(p, side): [] for p in ("first", "second") for side in ("on", "off")}
    cpu = {key: [] for key in times}
    for r in range(rounds):
        for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
            dataset = CausalLMDataset(_open(path, side == "on"), seq_len, shuffle=ShuffleSpec("full"))
            pipeline = Pipeline(dataset, mesh=mesh, batch_size=64, key=r, prefetch=1, workers=1)
            jax.block_until_ready(pipeline.batch(0))
            for p, first in (("first", 1), ("second", steps + 1)):
                start, start_cpu = time.perf_counter(), time.process_time()
                for s in range(first, first + steps):
                    jax.block_until_ready(pipeline.batch(s))
                times[(p, side)].append((time.perf_counter() - start) / steps)
                cpu[(p, side)].append((time.process_time() - start_cpu) / steps)
    row = {}
    for p in ("first", "second"):
        on, off = times[(p, "on")], times[(p, "off")]
        row[p] = {
            "off_ms_per_step": statistics.median(off) * 1e3,
            "on_ms_per_step": statistics.median(on) * 1e3,
            "on_over_off_time": _ratio(on, off),
            "on_over_off_cpu": _ratio(cpu[(p, "on")], cpu[(p, "off")]),
        }
        print(
            f"pipeline step (64 x {seq_len}, full shuffle, 1 device), steps {p}: off "
            f"{row[p]['off_ms_per_step']:.1f} ms, on {row[p]['on_ms_per_step']:.1f} ms, time on / off "
            f"{row[p]['on_over_off_time']:.3f}, CPU on / off {row[p]['on_over_off_cpu']:.3f} "
            "(medians of per-round ratios)"
        )
    return row


def chunk_costs(path: str, repeats: int) -> dict:
    """What verifying one chunk costs, apart from the machine's load: its CRC-32 (always), and
    decoding it once more (only when no read of the batch covers it whole), medians of ``repeats``."""
    from meshbatch.cache.integrity.checksums import chunk_crc

    cache = _open(path, False)
    size = 1 << 18
    values = cache.read_spans([0], [size])[0]
    crc, decode = [], []
    for r in range(repeats):
        start = time.perf_counter()
        chunk_crc(values)
        crc.append(time.perf_counter() - start)
        fresh = _open(path, False)  # an empty cache pool: the chunk is decoded from the (page-cached) file
        start = time.perf_counter()
        fresh.read_spans([(r % 8) * size], [size])
        decode.append(time.perf_counter() - start)
    row = {"crc_us": statistics.median(crc) * 1e6, "decode_us": statistics.median(decode) * 1e6}
    row["crc_mb_per_s"] = values.nbytes / (row["crc_us"] / 1e6) / 1e6
    print(
        f"one 256Ki-token chunk ({values.nbytes / 2**20:.0f} MiB): CRC-32 {row['crc_us']:.0f} us "
        f"({row['crc_mb_per_s']:.0f} MB/s), read + decode {row['decode_us']:.0f} us"
    )
    return row


def block_store(path: str, rounds: int, batches: int) -> dict:
    """Random batches of 256 blocks of 512 tokens from a preblocked store of the cache's documents,
    the store's chunk checks on and off, alternating: the first batch after an open (it touches
    most chunks, so it verifies them) and the batches after it."""
    from meshbatch.datasets.preblocked import preblock
    from meshbatch.datasets.preblocked.block_sources import open_blocks

    store = path + "-blocks"
    if not os.path.isdir(store):
        preblock(store, [path], block_size=512, vocab_size=50_257, shuffle_level="none", progress=False)
    n = open_blocks(store).num_blocks
    order = np.random.default_rng(0).integers(0, n, (batches + 1, 256))
    rates = {"first batch": {"on": [], "off": []}, "later batches": {"on": [], "off": []}}
    for r in range(rounds):
        for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
            os.environ["MESHBATCH_VERIFY_READS"] = "1" if side == "on" else "0"
            source = open_blocks(store)
            os.environ.pop("MESHBATCH_VERIFY_READS")
            start = time.perf_counter()  # a random batch touches most chunks: all verified here
            source.read_blocks(order[0])
            rates["first batch"][side].append(256 * 512 / (time.perf_counter() - start))
            start = time.perf_counter()
            for b in range(1, batches + 1):
                source.read_blocks(order[b])
            rates["later batches"][side].append(batches * 256 * 512 / (time.perf_counter() - start))
    row = {}
    for p, sides in rates.items():
        row[p] = {
            "off_tokens_per_s": statistics.median(sides["off"]),
            "on_tokens_per_s": statistics.median(sides["on"]),
            "on_over_off": _ratio(sides["on"], sides["off"]),
        }
        print(
            f"block store ({n} blocks of 512), random batches of 256, {p}: off "
            f"{row[p]['off_tokens_per_s'] / 1e6:.1f} M tok/s, on {row[p]['on_tokens_per_s'] / 1e6:.1f} M, "
            f"on / off {row[p]['on_over_off']:.3f}"
        )
    return row


def deep(path: str, repeats: int) -> dict:
    rates = []
    for _ in range(repeats):
        report = validate_cache(path, deep=True, progress=False)
        assert report.ok, report.error
        rates.append(report.bytes_read / report.seconds / 1e6)
    row = {"deep_mb_per_s_median": statistics.median(rates), "min": min(rates), "max": max(rates)}
    print(f"--deep: {row['deep_mb_per_s_median']:.0f} MB/s ({row['min']:.0f}-{row['max']:.0f})")
    return row


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1024 x 4096 tokens, 3 rounds")
    parser.add_argument("--cache", default=None, help="cache directory (default: a temp dir)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batches", type=int, default=16, help="timed batches per pass, at most")
    args = parser.parse_args(argv)
    examples, seq_len = (1024 if args.quick else 4096), 4096
    rounds = 3 if args.quick else args.rounds
    env = banner("bench_verify")
    path = args.cache or os.path.join(tempfile.gettempdir(), f"meshbatch-bench-verify-{examples}x{seq_len}")
    build_cache(path, examples=examples, seq_len=seq_len)
    result = {
        **env,
        "cache": path,
        "tokens": examples * seq_len,
        "open": opens(path, 2 * rounds),
        "chunk": chunk_costs(path, 8 * rounds),
        "reads": reads(path, seq_len, rounds, args.batches),
        "pipeline": pipeline_steps(path, seq_len, rounds, args.batches),
        "blocks": block_store(path, rounds, args.batches),
        "deep": deep(path, 3),
    }
    write_json(__file__, result)
    return result


if __name__ == "__main__":
    main()
