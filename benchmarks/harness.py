"""Shared benchmark plumbing: environment banner, median-of-N timing, JSON next to the script."""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import platform
from collections.abc import Callable

import jax

from meshbatch.bench import call_times, distribution


def banner(title: str) -> dict:
    """Print and return what the numbers depend on: versions, device kind, CPU count."""
    env = {
        "benchmark": title,
        "jax": jax.__version__,
        "device": f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}",
        "devices": jax.device_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(f"# {title}  jax {env['jax']}  device {env['device']} x{env['devices']}  ({env['machine']})")
    return env


def median_seconds(fn: Callable[[], object], *, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` (``meshbatch.bench``'s
    ``call_times`` and ``distribution``: each call waited for)."""
    return distribution(call_times(fn, repeats=repeats, warmup=warmup))["median_s"]


def rotating_times(
    fns: dict[str, Callable[[], object]], *, rounds: int, repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Wall times of each ``fn()`` over ``rounds`` rotations of ``repeats`` back-to-back runs
    (``meshbatch.bench.call_times``: each call waited for).

    Each implementation runs back to back (its steady state: warm caches, reused buffers), and
    the rotation spreads a noisy neighbour's slow spells over all of them.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name] += call_times(fn, repeats=repeats, warmup=warmup)
    return times


def keep_freed_memory() -> str:
    """Ask glibc to keep freed blocks for reuse (no ``mmap`` per block, never trim the heap).

    With glibc's defaults every large array a call returns (XLA outputs, numpy temporaries) is a
    fresh ``mmap`` that the kernel zero-fills page by page, so a benchmark would time page faults,
    and whoever ran just before decides how many. A long-running process reuses its heap; this
    makes a benchmark process do the same, for both sides of every comparison. Returns a label.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return "allocator unchanged (not glibc)"
    m_trim_threshold, m_mmap_max = -1, -4
    if libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**30):
        return "glibc: freed blocks kept for reuse (M_MMAP_MAX=0, M_TRIM_THRESHOLD=1 GiB)"
    return "allocator unchanged (mallopt refused)"


def write_json(script: str, payload: dict) -> pathlib.Path:
    """Write ``payload`` into ``<script stem>.json``: its keys replace the file's, and every other
    key the file holds stays (``RESULTS.md`` cites recorded runs by key, e.g. ``run_1`` or
    ``selection_run12``: a new run must not erase them).

    The file is beside the script (a run recorded for ``RESULTS.md``), or in the directory
    ``MESHBATCH_BENCH_OUT`` names (``make bench`` sets it: a run that records nothing leaves the
    checkout as it was)."""
    out = os.environ.get("MESHBATCH_BENCH_OUT")
    path = pathlib.Path(script).with_suffix(".json")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        path = pathlib.Path(out) / path.name
    recorded = json.loads(path.read_text()) if path.exists() else {}
    kept = sorted(set(recorded) - set(payload))
    path.write_text(json.dumps(recorded | payload, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}" + (f" (kept its recorded keys {', '.join(kept)})" if kept else ""))
    return path


def write_zipf_cache(path: str, tokens: int, vocab: int) -> None:
    """A token cache of at least ``tokens`` tokens: documents of 500-20k Zipf(1.2) ids below ``vocab``
    (seeded), as the object-store and pod-batch benchmarks read them."""
    import numpy as np

    from meshbatch.cache import CacheWriter

    rng = np.random.default_rng(0)
    with CacheWriter(path, flush_tokens=1 << 26) as writer:
        written = 0
        while written < tokens:
            docs = [
                np.minimum(rng.zipf(1.2, rng.integers(500, 20_000)), vocab - 1).astype(np.int32)
                for _ in range(64)
            ]
            writer.write(docs)
            written += sum(doc.size for doc in docs)
