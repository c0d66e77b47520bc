"""``meshbatch bench``'s runs: the cases measured, the environment, the JSON and the table.

report = run_bench(["causal_build", "pipeline_step"], Shapes(), repeats=20)
path = write_report(report, "/tmp/bench")     # /tmp/bench/bench-<UTC time>.json
print(format_table(report))
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import pathlib
import platform
import tempfile
from collections.abc import Sequence
from typing import Any

import jax

from .kernel_cases import CASES, NEEDS_CACHE, Shapes
from .measure import MIN_REPEATS, accelerator, copy_bandwidth, measure
from .pipeline_step import cache_tokens, measure_pipeline_step, write_scratch_cache

logger = logging.getLogger(__name__)
SCHEMA_VERSION = 1
ALL = (*CASES, "pipeline_step")


def environment() -> dict[str, Any]:
    """What the numbers depend on: versions, devices, host."""
    import jaxlib

    import meshbatch

    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "meshbatch": meshbatch.__version__,
        "platform": device.platform,
        "device_kind": device.device_kind,
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "timing": "device (jax.profiler trace) and wall" if accelerator(device) else "wall",
        "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def run_bench(
    names: Sequence[str], shapes: Shapes, *, repeats: int = MIN_REPEATS, dispatch_calls: int = 100
) -> dict[str, Any]:
    """Measures ``names`` (keys of ``CASES`` and ``"pipeline_step"``) at ``shapes``; the report
    ``write_report`` writes.

    Raises:
        ValueError: an unknown name, naming it and the known ones.
    """
    unknown = [n for n in names if n not in ALL]
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r}; known: {', '.join(ALL)}")
    bandwidth = copy_bandwidth()
    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "environment": environment(),
        "shapes": shapes.__dict__ | {"repeats": repeats, "dispatch_calls": dispatch_calls},
        "copy_bandwidth_bytes_per_s": bandwidth,
        "results": [],
    }
    with tempfile.TemporaryDirectory(prefix="meshbatch-bench-") as scratch:
        cache = None
        if any(n in NEEDS_CACHE or n == "pipeline_step" for n in names):
            tokens = cache_tokens(shapes)
            logger.info("writing a scratch cache of %d tokens in %s", tokens, scratch)
            cache = write_scratch_cache(os.path.join(scratch, "cache"), tokens)
        for name in names:
            logger.info("measuring %s", name)
            if name == "pipeline_step":
                report["results"].append(measure_pipeline_step(cache, shapes, repeats=repeats))
                continue
            family, make = CASES[name]
            case = make(shapes, cache) if name in NEEDS_CACHE else make(shapes)
            m = measure(
                case.fn,
                case.args,
                name=case.name,
                family=family,
                config=case.config,
                variants=case.variants,
                repeats=repeats,
                dispatch_calls=dispatch_calls,
                bandwidth=bandwidth,
            )
            report["results"].append(m.to_json())
    return report


def checkout_root() -> pathlib.Path | None:
    """The source checkout meshbatch is imported from (an editable install), if any."""
    here = pathlib.Path(__file__).resolve()
    for parent in here.parents:
        if (parent / ".git").exists() and (parent / "pyproject.toml").exists():
            return parent
    return None


def write_report(report: dict[str, Any], out_dir: str | os.PathLike) -> pathlib.Path:
    """Writes ``report`` as ``<out_dir>/bench-<UTC time>.json``; returns its path.

    Raises:
        ValueError: ``out_dir`` inside the meshbatch checkout (results never go into the sources).
    """
    out = pathlib.Path(out_dir).expanduser().resolve()
    root = checkout_root()
    if root is not None and out.is_relative_to(root):
        raise ValueError(f"--out {out} is inside the meshbatch checkout {root}: write results elsewhere")
    out.mkdir(parents=True, exist_ok=True)
    stamp = report["environment"]["utc"].replace(":", "").replace("+0000", "Z")
    path = out / f"bench-{stamp}.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return path


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def format_table(report: dict[str, Any]) -> str:
    """A Markdown table of ``report``: split times, run distribution, dispatch, recompiles, bytes."""
    head = (
        "| benchmark | trace ms | lower ms | compile ms | run p10 / median / p90 ms | dispatch /s "
        "| recompiles | bytes accessed | memory (arg+out+temp) | of copy bw (accessed / output) |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in report["results"]:
        run = r["device_run"] or r["run"]
        mem = r["memory"]
        mem_bytes = (
            sum(mem.get(k, 0) for k in ("argument_bytes", "output_bytes", "temp_bytes")) if mem else None
        )
        frac, io = r.get("bandwidth_fraction"), r.get("output_bandwidth_fraction")
        lines.append(
            f"| {r['name']} | {_ms(r['trace_s'])} | {_ms(r['lower_s'])} | {_ms(r['compile_s'])} "
            f"| {_ms(run['p10_s'])} / {_ms(run['median_s'])} / {_ms(run['p90_s'])} "
            f"| {r['dispatch']['calls_per_s']:.0f} | {r['recompiles']} "
            f"| {_bytes(r['cost'].get('bytes_accessed'))} | {_bytes(mem_bytes)} "
            f"| {_pct(frac)} / {_pct(io)} |"
        )
    env = report["environment"]
    lines.append("")
    lines.append(
        f"jax {env['jax']}, jaxlib {env['jaxlib']}, "
        f"{env['platform']}:{env['device_kind']} x{env['devices']}, "
        f"timing: {env['timing']}; copy bandwidth {report['copy_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s"
    )
    return "\n".join(lines)


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.1%}"
