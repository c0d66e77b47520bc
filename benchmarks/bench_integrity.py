"""Integrity benchmark: what ``validate-cache`` (default and ``--deep``) and the replaced-cache check cost.

What is measured, in one run:

- validation of two caches written by meshbatch (so with checksum sidecars): the demo cache (the
  CPython ``pydoc_data.topics`` documents as JSONL through the byte tokenizer, exactly as
  ``meshbatch.demo`` builds it) and a synthetic cache of random int32 tokens in documents of
  100..7999 tokens (``--tokens``, 64Mi = 256 MiB by default). ``default``: seconds of
  ``validate_cache(path)`` (metadata only). ``deep``: ``validate_cache(path, deep=True)``, reported
  as MB/s of decoded chunk bytes (data + offsets) per second; each run opens the arrays with an
  empty TensorStore cache pool, and one untimed pass first puts the files in the page cache, so
  this is decode + CRC-32 speed, not disk speed;
- the replaced-cache check on the read path: the check alone (the conditional ledger read and its
  completion, median of 2000 calls), and ``run_reads`` of one planned read with the check (as every
  read runs) against the same read with ``PendingRead.check = None``, for a batch of 64 spans of
  4096 tokens at random places and for one 64-token span (where a fixed cost shows most). The two
  alternate call by call (``--repeats`` x 200 calls each); the medians and their difference.

Median of ``--repeats``; absolute numbers only mean something on the machine that made them.

    python benchmarks/bench_integrity.py           # 64Mi-token synthetic cache
    python benchmarks/bench_integrity.py --quick   # 8Mi tokens, fewer repetitions
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
from harness import banner, write_json

from meshbatch.cache import CacheWriter, TokenCache, build_cache, run_reads, validate_cache
from meshbatch.cache.format.ledger import try_read_ledger
from meshbatch.demo import write_corpus


def demo_cache(root: str) -> str:
    """The demo's cache: pydoc topics as JSONL, byte tokenizer (as ``meshbatch.demo`` builds it)."""
    import pathlib

    corpus = pathlib.Path(root) / "corpus.jsonl"
    write_corpus(corpus)
    build_cache(os.path.join(root, "demo"), [str(corpus)], if_exists="resume", progress=False)
    return os.path.join(root, "demo")


def synthetic_cache(root: str, tokens: int, seed: int = 0) -> str:
    path = os.path.join(root, f"synthetic-{tokens}")
    metadata = {"bench_integrity": {"tokens": tokens, "seed": seed}}
    done = try_read_ledger(path)
    if done is not None and done.is_finished and done.metadata == {"preprocessor_metadata": metadata}:
        return path
    rng = np.random.default_rng(seed)
    flat = rng.integers(0, 50_257, size=tokens, dtype=np.int32)
    cuts = np.cumsum(rng.integers(100, 8000, size=tokens // 100))
    with CacheWriter(path, if_exists="overwrite", metadata=metadata) as writer:
        writer.write(np.split(flat, cuts[cuts < tokens]))
    return path


def validation(path: str, repeats: int) -> dict:
    validate_cache(path, deep=True, progress=False)  # untimed: page cache warm
    default = statistics.median(_seconds(lambda: validate_cache(path)) for _ in range(repeats))
    reports = [validate_cache(path, deep=True, progress=False) for _ in range(repeats)]
    assert all(r.ok for r in reports), reports[0].error
    rates = [r.bytes_read / r.seconds / 1e6 for r in reports]
    return {
        "path": path,
        "tokens": reports[0].num_tokens,
        "rows": reports[0].num_rows,
        "deep_bytes": reports[0].bytes_read,
        "default_s": default,
        "deep_s": statistics.median(r.seconds for r in reports),
        "deep_mb_per_s": statistics.median(rates),
        "checksums": reports[0].checksums,
    }


def check_cost(path: str, spans: int, length: int, rounds: int, repeats: int) -> dict:
    cache = TokenCache.open(path)
    rng = np.random.default_rng(1)
    starts = rng.integers(0, cache.num_tokens - length, size=spans)
    out = np.empty(spans * length, np.int32)

    def read(checked: bool):
        def run() -> None:
            read = cache.prepare_read(starts, np.full(spans, length), out, 0)
            if not checked:
                read.check = None
            run_reads([read])

        return run

    check_alone = statistics.median(_seconds(lambda: cache._watch.start()()) for _ in range(2000))
    runs = {"checked": read(True), "unchecked": read(False)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(rounds * repeats):  # alternate call by call, who goes first alternating too
        for name in list(runs) if i % 2 else list(runs)[::-1]:
            times[name].append(_seconds(runs[name]))
    checked, unchecked = statistics.median(times["checked"]), statistics.median(times["unchecked"])
    return {
        "spans": spans,
        "length": length,
        "checked_us": checked * 1e6,
        "unchecked_us": unchecked * 1e6,
        "check_us": (checked - unchecked) * 1e6,
        "check_alone_us": check_alone * 1e6,
        "overhead": checked / unchecked - 1,
    }


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8Mi-token synthetic cache, fewer repetitions")
    parser.add_argument("--tokens", type=int, default=64 * 2**20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "meshbatch-bench-integrity"))
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats = 8 * 2**20, 3
    env = banner("bench_integrity")
    os.makedirs(args.root, exist_ok=True)
    caches = {"demo": demo_cache(args.root), "synthetic": synthetic_cache(args.root, args.tokens)}
    rows = {name: validation(path, args.repeats) for name, path in caches.items()}
    print("\n| cache | tokens | default validate | --deep | --deep MB/s | checksums |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['tokens']:,} | {r['default_s'] * 1e3:.1f} ms | {r['deep_s']:.2f} s "
            f"| {r['deep_mb_per_s']:.0f} | {r['checksums']} |"
        )
    costs = [
        check_cost(caches["synthetic"], spans, length, rounds=args.repeats, repeats=200)
        for spans, length in ((64, 4096), (1, 64))
    ]
    print("\n| read | with check | without | difference | overhead | the check alone |")
    print("|---|---|---|---|---|---|")
    for c in costs:
        print(
            f"| {c['spans']} x {c['length']} tokens | {c['checked_us']:.0f} us | {c['unchecked_us']:.0f} us "
            f"| {c['check_us']:.0f} us | {c['overhead']:+.1%} | {c['check_alone_us']:.0f} us |"
        )
    result = {**env, "tokens": args.tokens, "repeats": args.repeats, "validation": rows, "check_cost": costs}
    write_json(__file__, result)
    return result


if __name__ == "__main__":
    main()
