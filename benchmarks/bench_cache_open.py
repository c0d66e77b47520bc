"""Opening token caches of many shards and many documents: open time, first read, memory.

Method: sharded caches of ``--shards`` (10, 100, 1000, 10000) tiny shards (8 documents of 1-64
tokens each, about 260 tokens a shard), and a consolidated cache of ``--docs`` (10**7) documents
of 1-3 tokens. A shard is written once by ``CacheWriter`` and copied (files as written: ledger,
checksum sidecar, zarr arrays) under ``p0 .. p{N-1}``; the top-level ledger is written as
``ShardedCacheWriter.finish`` writes it. The large consolidated cache is written in Levanter's
layout directly (``create_field`` and one bulk write of each array, no checksum sidecar), as
Levanter writes it. Caches live on local disk and, preloaded, in a bucket of a fake-gcs-server on
127.0.0.1 reached through a ``LatencyProxy`` (``tests/object_store.py``) that holds every request
``uniform(80, 120)`` ms: an object store at about 100 ms a request.

Each measurement runs in a fresh process that imports meshbatch from ``--src`` (``new``: this
checkout; ``old``: a checkout of the code before lazy opens, ``--old-src``), so the two run side by
side on the same caches and servers. The process measures: the ``TokenCache.open`` time (defaults),
the first read (one step: 8 spans of 1024 tokens at seeded random offsets), resident memory (RSS)
after open and after ``--steps`` (100) such steps, each relative to the RSS just before the open.
A run that exceeds ``--timeout`` seconds is recorded as timed out, with what it measured before
(the open, the first read, and the steps it made, counted every 10). Results print as a table and go
to ``bench_cache_open.json``.

    python benchmarks/bench_cache_open.py [--quick] [--old-src /path/to/old/src]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE.parent / "src"
BUCKET = "meshbatch"
SPAN, SPANS = 1024, 8  # a step: 8 spans of 1024 tokens


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def child(path: str, steps: int) -> dict:
    """Runs in a fresh process (``--child``): open, first read, steps; times and RSS deltas."""
    import numpy as np

    import meshbatch
    from meshbatch.cache import TokenCache

    base = _rss()
    start = time.perf_counter()
    cache = TokenCache.open(path)
    opened = time.perf_counter() - start
    after_open = _rss() - base
    print(json.dumps({"open_s": opened, "rss_after_open_mb": after_open / 2**20}), flush=True)
    rng = np.random.default_rng(0)

    def step() -> None:
        starts = rng.integers(0, cache.num_tokens - SPAN, SPANS)
        cache.read_spans(starts, SPAN)

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    so_far = {"open_s": opened, "rss_after_open_mb": after_open / 2**20, "first_read_s": first}
    print(json.dumps(so_far), flush=True)
    start = time.perf_counter()
    for done in range(1, steps + 1):
        step()
        if done % 10 == 0 or done == steps:  # a run stopped by --timeout keeps the steps it made
            progress = {"steps_done": done, "steps_s": time.perf_counter() - start}
            progress["rss_after_steps_mb"] = (_rss() - base) / 2**20
            print(json.dumps({**so_far, **progress}), flush=True)
    stepping = time.perf_counter() - start
    return {
        **so_far,
        "steps_done": steps,
        "steps_s": stepping,
        "rss_after_steps_mb": (_rss() - base) / 2**20,
        "rows": cache.num_rows,
        "tokens": cache.num_tokens,
        "eager": getattr(cache, "is_eager", True),
        "module": meshbatch.__file__,
    }


def _shard_template(path: str) -> None:
    import numpy as np

    from meshbatch.cache import CacheWriter

    rng = np.random.default_rng(0)
    with CacheWriter(path) as writer:
        writer.write([rng.integers(2, 30_000, rng.integers(1, 65)).astype(np.int32) for _ in range(8)])


def build_sharded(root: str, shards: int, template: str) -> None:
    """``shards`` copies of the shard ``template`` under ``root``, and the top-level ledger."""
    from meshbatch.cache.format.ledger import SHARDED, Ledger, read_ledger, write_ledger

    shard = read_ledger(template)
    rows, tokens = shard.total_num_rows, shard.field_counts["input_ids"]
    names = [f"p{i}" for i in range(shards)]
    for name in names:
        shutil.copytree(template, os.path.join(root, name))
    ledger = Ledger(
        total_num_rows=rows * shards,
        shard_rows={name: rows for name in names},
        is_finished=True,
        finished_shards=tuple(names),
        field_counts={"input_ids": tokens * shards},
        field_counts_by_shard={name: {"input_ids": tokens} for name in names},
        layout=SHARDED,
        cache_id=uuid.uuid4().hex,
    )
    write_ledger(root, ledger)


def build_many_docs(root: str, docs: int) -> None:
    """A consolidated cache of ``docs`` documents of 1-3 tokens, in Levanter's layout (no sidecar)."""
    import numpy as np

    from meshbatch.cache.format.arrays import create_field
    from meshbatch.cache.format.ledger import Ledger, write_ledger

    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 4, docs)
    ends = np.cumsum(lengths)
    arrays = create_field(root, "input_ids", np.dtype(np.int32))
    tokens = int(ends[-1])
    arrays.data[:tokens].write(rng.integers(2, 30_000, tokens).astype(np.int32)).result()
    arrays.offsets[1 : docs + 1].write(ends).result()
    arrays.offsets[0].write(docs).result()
    write_ledger(
        root,
        Ledger(
            total_num_rows=docs, shard_rows={"": docs}, is_finished=True, field_counts={"input_ids": tokens}
        ),
    )


def measure(src: str, path: str, steps: int, timeout: float, env: dict) -> dict:
    command = [sys.executable, __file__, "--child", path, "--steps", str(steps)]
    full_env = {**os.environ, **env, "PYTHONPATH": src, "JAX_PLATFORMS": "cpu"}
    try:
        done = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # what it measured before: the open, at least
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        lines = [line for line in out.splitlines() if line.startswith("{")]
        return {"timed_out_s": timeout, **(json.loads(lines[-1]) if lines else {})}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--shards", default="10,100,1000,10000")
    parser.add_argument("--docs", type=int, default=10**7)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument(
        "--store-shards", default="10,100,1000,10000", help="shard counts also read at the store"
    )
    parser.add_argument("--old-src", default=None, help="src/ of the code to compare against")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-store", action="store_true")
    parser.add_argument("--quick", action="store_true", help="10 and 100 shards, 10**5 documents, 10 steps")
    parser.add_argument("--key", default=None, help="JSON key of this run (default: run, or quick)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return
    if args.quick:
        args.shards, args.store_shards, args.docs, args.steps = "10,100", "10,100", 10**5, 10
    sys.path.insert(0, str(SRC))
    sys.path.insert(0, str(HERE.parent / "tests"))
    shard_counts = [int(s) for s in args.shards.split(",") if s]
    store_counts = {int(s) for s in args.store_shards.split(",") if s} & set(shard_counts)
    impls = {"new": str(SRC)} | ({"old": args.old_src} if args.old_src else {})
    from harness import write_json

    key = args.key or ("quick" if args.quick else "run")
    work = tempfile.mkdtemp(prefix="bench-cache-open-")
    results, servers = [], []

    def record() -> None:  # after every measurement: an interrupted run keeps what it measured
        write_json(__file__, {key: {"steps": args.steps, "span": SPAN, "spans": SPANS, "results": results}})

    try:
        template = os.path.join(work, "template")
        _shard_template(template)
        caches = []
        for n in shard_counts:
            start = time.perf_counter()
            build_sharded(os.path.join(work, f"shards-{n}"), n, template)
            print(f"built {n} shards in {time.perf_counter() - start:.1f}s", flush=True)
            caches.append((f"{n} shards", os.path.join(work, f"shards-{n}"), n in store_counts))
        if args.docs:
            start = time.perf_counter()
            build_many_docs(os.path.join(work, "docs"), args.docs)
            print(f"built {args.docs} documents in {time.perf_counter() - start:.1f}s", flush=True)
            caches.append((f"{args.docs} docs", os.path.join(work, "docs"), True))
        env, proxy, urls = {}, None, {}
        if not args.no_store:
            from object_store import ENV, GCSServer, LatencyProxy

            urls = {path: f"{BUCKET}/{uuid.uuid4().hex}" for _, path, on_store in caches if on_store}
            start = time.perf_counter()
            gcs = GCSServer((BUCKET,), preload={prefix: path for path, prefix in urls.items()})
            servers.append(gcs)
            print(f"started the store holding {len(urls)} caches in {time.perf_counter() - start:.1f}s")
            proxy = LatencyProxy(gcs.port, low=0.0, high=0.0, seed=0)
            servers.append(proxy)
            env = {**ENV, "TENSORSTORE_GCS_HTTP_URL": proxy.url}
            os.environ.update(env)
        for name, path, _ in caches:
            places = [("local", path)] + ([("gcs 100 ms", f"gs://{urls[path]}")] if path in urls else [])
            for place, where in places:
                if proxy is not None:
                    proxy.low, proxy.high = (0.08, 0.12) if place != "local" else (0.0, 0.0)
                for impl, src in impls.items():
                    got = measure(src, where, args.steps, args.timeout, env)
                    row = {"cache": name, "store": place, "code": impl, **got}
                    results.append(row)
                    print(_line(row), flush=True)
                    record()
    finally:
        for server in reversed(servers):
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(_table(results))


def _partial(row: dict) -> tuple[str, str, str, str]:
    """The cells of a row: open s, first read s, RSS after open, RSS after steps (with their count)."""

    def num(name: str, spec: str) -> str:
        return format(row[name], spec) if name in row else ""

    steps = ""
    if "rss_after_steps_mb" in row:
        steps = f"{row['rss_after_steps_mb']:.1f}"
        if "timed_out_s" in row:
            steps += f" ({row['steps_done']} steps, {row['steps_s']:.0f} s)"
    return num("open_s", ".3f"), num("first_read_s", ".3f"), num("rss_after_open_mb", ".1f"), steps


def _line(row: dict) -> str:
    if "error" in row:
        what = f"error: {row['error']}"
    else:
        opened, first, after_open, after_steps = _partial(row)
        what = f"open {opened or '-':>8}s  first read {first or '-':>7}s  "
        what += f"{after_open or '-':>7} MB after open, {after_steps or '-'} MB after steps"
        if "timed_out_s" in row:
            what += f"; timed out after {row['timed_out_s']:.0f}s"
    return f"{row['cache']:>16} {row['store']:>10} {row['code']:>4}  {what}"


def _table(results: list[dict]) -> str:
    head = "| cache | store | code | open s | first read s | RSS after open MB | RSS after steps MB |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for row in results:
        if "error" in row:
            cells = f"{row['error']} | | | "
        else:
            opened, first, after_open, after_steps = _partial(row)
            if "timed_out_s" in row:
                after_steps += f" (timed out at {row['timed_out_s']:.0f} s)"
            cells = f"{opened} | {first} | {after_open} | {after_steps}"
        lines.append(f"| {row['cache']} | {row['store']} | {row['code']} | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
