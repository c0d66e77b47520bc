"""CI gates on top of ``measure`` and ``count_compiles``: a recompile or a slowdown fails.

    assert_no_recompiles(fn, args, [("step 1", args_1), ("key 1", args_k1)])
    assert_no_regression(run_bench([...], shapes)["results"], json.load(open("baseline.json")),
                         tolerance=0.25)

The pytest fixture ``jit_bench`` (``meshbatch.bench.pytest_plugin``) hands both to a test.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from .compile_count import variant_compiles
from .measure import Measurement


def assert_no_recompiles(fn: Callable, args: tuple, variants: Sequence[tuple[str, tuple]]) -> None:
    """Raises ``AssertionError`` naming each variant that made ``jax.jit(fn)`` compile again
    after one call on ``args``."""
    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*args))
    found = {label: n for label, n in variant_compiles(jitted, variants).items() if n}
    if found:
        raise AssertionError(
            f"{getattr(fn, '__name__', fn)!r} recompiled: {found} (variant: programs compiled)"
        )


def assert_no_regression(
    results: Sequence[Mapping[str, Any] | Measurement],
    baseline: Mapping[str, Any] | str | os.PathLike,
    *,
    tolerance: float = 0.25,
) -> None:
    """Raises ``AssertionError`` for each result (a ``Measurement`` or its JSON row) whose median
    run time exceeds the baseline's (a ``meshbatch bench`` JSON, or its path, by benchmark name)
    by more than ``tolerance``, or that recompiles where the baseline did not. Names missing from
    the baseline are not compared.

    Raises:
        ValueError: a negative ``tolerance`` or a baseline without ``results``.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance={tolerance} must be >= 0")
    if not isinstance(baseline, Mapping):
        with open(baseline) as f:
            baseline = json.load(f)
    if "results" not in baseline:
        raise ValueError(
            f"the baseline has no 'results' (keys: {sorted(baseline)}): not a meshbatch bench JSON"
        )
    before = {r["name"]: r for r in baseline["results"]}
    failures = []
    for r in (r.to_json() if isinstance(r, Measurement) else r for r in results):
        old = before.get(r["name"])
        if old is None:
            continue
        now_s, old_s = _median(r), _median(old)
        if now_s > old_s * (1 + tolerance):
            failures.append(
                f"{r['name']}: median {now_s * 1e3:.3f} ms > {old_s * 1e3:.3f} ms + {tolerance:.0%}"
            )
        if r["recompiles"] > old["recompiles"]:
            failures.append(f"{r['name']}: {r['recompiles']} recompiles (baseline {old['recompiles']})")
    if failures:
        raise AssertionError("; ".join(failures))


def _median(result: Mapping[str, Any]) -> float:
    """The median run time of a result: the device's where it was read, else wall time."""
    return (result.get("device_run") or result["run"])["median_s"]
