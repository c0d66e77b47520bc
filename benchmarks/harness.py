"""Shared benchmark plumbing: environment banner, median-of-N timing, JSON next to the script."""

from __future__ import annotations

import json
import pathlib
import platform
import statistics
import time
from collections.abc import Callable

import jax


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
    """Median wall time of ``fn()``; ``fn`` must block until its result is ready."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def write_json(script: str, payload: dict) -> pathlib.Path:
    """Write ``payload`` as ``<script stem>.json`` beside the script."""
    path = pathlib.Path(script).with_suffix(".json")
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return path
