"""One jitted function measured the way a JAX engineer reads it: stages apart, runs as a
distribution, dispatch rate, recompiles, bytes.

    m = measure(fn, args, name="causal_build", variants=[("step 1", args_1), ("key 1", args_k1)])
    m.trace_s, m.lower_s, m.compile_s       # jax.jit(fn).trace(*args), .lower(), .compile(), timed apart
    m.run                                   # {median_s, p10_s, p90_s, min_s, max_s, calls, timing}
    m.dispatch                              # calls/s of jitted(*args) without waiting between calls
    m.recompiles                            # programs compiled for the variants (0: none)
    m.cost, m.memory                        # XLA's cost_analysis / memory_analysis, in bytes
    m.bandwidth_fraction                    # XLA's bytes accessed / run time / copy bandwidth
    m.output_bandwidth_fraction             # output bytes / run time / copy bandwidth

XLA's ``bytes accessed`` counts every operand and result of every operation, wherever it lives:
a program whose working set stays in the caches moves far fewer bytes through memory, and its
fraction can pass 1. The results are written to memory at least once: their fraction is a floor
of the program's memory traffic (arguments need not be read whole: a table, a document pool).

Run time: each call is ``compiled(*args)`` then ``jax.block_until_ready`` (wall time: the host's
dispatch and the wait for the result included). On a GPU or TPU the device's own time per call
(what its streams or cores spent on the program) is also read: ``device_seconds`` runs the
compiled program ``calls`` times inside ``jax.profiler.trace(..., create_perfetto_trace=True)`` and
reads the Perfetto JSON it writes:

* the processes whose name names a device (``/device:GPU:0``, ``/device:TPU:0``);
* where they have an ``XLA Modules`` thread (TPU; GPU with module-level tracing), one event per
  execution of the program: the per-call device times;
* otherwise (GPU kernels on CUDA streams) every complete event on those processes, summed and
  split evenly over the calls: one mean device time per call, repeated ``calls`` times.

On a CPU the trace has no device process: there is nothing to read, ``device_seconds`` raises,
and ``run["timing"]`` says ``"wall"``.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import pathlib
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .compile_count import variant_compiles

logger = logging.getLogger(__name__)
MIN_REPEATS = 20


@dataclasses.dataclass
class Measurement:
    """What ``measure`` found for one function (``to_json`` is its JSON row)."""

    name: str
    family: str
    config: dict[str, Any]
    trace_s: float
    lower_s: float
    compile_s: float
    run: dict[str, Any]
    device_run: dict[str, Any] | None
    dispatch: dict[str, float]
    recompiles: int
    recompiles_by_variant: dict[str, int]
    cost: dict[str, float]
    memory: dict[str, int]
    bandwidth_fraction: float | None
    output_bandwidth_fraction: float | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def distribution(times: Sequence[float]) -> dict[str, float]:
    """``{median_s, p10_s, p90_s, min_s, max_s, mean_s, calls}`` of per-call seconds."""
    t = np.asarray(times, np.float64)
    if t.size == 0:
        raise ValueError("no times to summarise")
    return {
        "median_s": float(np.median(t)),
        "p10_s": float(np.percentile(t, 10)),
        "p90_s": float(np.percentile(t, 90)),
        "min_s": float(t.min()),
        "max_s": float(t.max()),
        "mean_s": float(t.mean()),
        "calls": int(t.size),
    }


def accelerator(device: jax.Device | None = None) -> bool:
    """Whether ``device`` (default: the first) is a GPU or TPU, whose own time a profiler reads."""
    device = device or jax.devices()[0]
    return device.platform in ("gpu", "cuda", "rocm", "tpu")


def cost_of(compiled) -> dict[str, float]:
    """``flops`` and ``bytes_accessed`` from XLA's ``cost_analysis`` (empty where the backend has
    none)."""
    try:
        cost = compiled.cost_analysis()
    except Exception as error:  # a backend without a cost model
        logger.info("cost_analysis unavailable: %r", error)
        return {}
    if isinstance(cost, list | tuple):  # older jax: one dict per program
        cost = cost[0] if cost else {}
    out = {}
    for key, name in (("flops", "flops"), ("bytes accessed", "bytes_accessed")):
        if cost and key in cost:
            out[name] = float(cost[key])
    return out


def memory_of(compiled) -> dict[str, int]:
    """Argument, output, temporary and code bytes from XLA's ``memory_analysis``."""
    try:
        memory = compiled.memory_analysis()
    except Exception as error:
        logger.info("memory_analysis unavailable: %r", error)
        return {}
    if memory is None:
        return {}
    fields = (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "temp_size_in_bytes",
        "alias_size_in_bytes",
        "generated_code_size_in_bytes",
    )
    return {
        f.removesuffix("_size_in_bytes") + "_bytes": int(getattr(memory, f))
        for f in fields
        if hasattr(memory, f)
    }


def device_seconds(compiled, args: tuple, *, calls: int) -> list[float]:
    """Seconds of device time of each of ``calls`` runs of ``compiled(*args)`` (see the module
    docstring).

    Raises:
        RuntimeError: the trace holds no device activity (a CPU, or a profiler without device
            tracing), naming the trace's processes.
    """
    jax.block_until_ready(compiled(*args))
    with tempfile.TemporaryDirectory(prefix="meshbatch-profile-") as where:
        with jax.profiler.trace(where, create_perfetto_trace=True):
            for _ in range(calls):
                jax.block_until_ready(compiled(*args))
        traces = sorted(pathlib.Path(where).rglob("perfetto_trace.json.gz"))
        if not traces:
            raise RuntimeError(f"jax.profiler wrote no perfetto_trace.json.gz under {where}")
        with gzip.open(traces[-1], "rt") as f:
            trace = json.load(f)
    return per_call_seconds(trace, calls)


def per_call_seconds(trace: dict, calls: int) -> list[float]:
    """Per-call device seconds from a Perfetto (Chrome trace format) JSON; see the module
    docstring."""
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    process_names, thread_names = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            process_names[e["pid"]] = e.get("args", {}).get("name", "")
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            thread_names[(e["pid"], e.get("tid"))] = e.get("args", {}).get("name", "")
    devices = {pid for pid, name in process_names.items() if "/device:" in name and "CPU" not in name}
    if not devices:
        raise RuntimeError(
            f"the profiler trace has no device process (processes: {sorted(process_names.values())})"
        )
    modules: dict[int, list[float]] = defaultdict(list)
    total = 0.0
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in devices:
            continue
        seconds = float(e.get("dur", 0.0)) * 1e-6  # microseconds
        if thread_names.get((e["pid"], e.get("tid")), "") == "XLA Modules":
            modules[e["pid"]].append(seconds)
        else:
            total += seconds
    lead = next((v for _, v in sorted(modules.items()) if len(v) >= calls), None)
    if lead is not None:
        return lead[-calls:]
    if total <= 0:
        raise RuntimeError("the profiler trace has device processes but no device events")
    return [total / calls] * calls


_COPY_BANDWIDTH: dict[tuple[str, int], float] = {}


def copy_bandwidth(nbytes: int | None = None, *, repeats: int = MIN_REPEATS) -> float:
    """The device's measured copy bandwidth in bytes/s: the median time of a jitted ``x + 1`` over
    ``nbytes`` of int32, its input donated (read once, written once in place: ``2 * nbytes``
    moved, no fresh buffer to fault in). Default size: 64 MiB on a CPU, 1 GiB on an
    accelerator. Measured once per process and size."""
    device = jax.devices()[0]
    if nbytes is None:
        nbytes = (1 << 30) if accelerator(device) else (64 << 20)
    found = _COPY_BANDWIDTH.get((device.device_kind, nbytes))
    if found is not None:
        return found
    x = jnp.zeros(nbytes // 4, jnp.int32)
    step = jax.jit(lambda x: x + 1, donate_argnums=0)
    x = jax.block_until_ready(step(x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x = jax.block_until_ready(step(x))
        times.append(time.perf_counter() - start)
    bandwidth = 2 * (nbytes // 4) * 4 / float(np.median(times))
    _COPY_BANDWIDTH[(device.device_kind, nbytes)] = bandwidth
    return bandwidth


def call_times(fn: Callable[[], object], *, repeats: int, warmup: int = 0) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn()``, each waited for (``jax.block_until_ready`` on
    its result, so a jitted call's dispatch and run are both in it), after ``warmup`` untimed calls.
    Host code times the same way (its result is returned ready).

    Raises:
        ValueError: ``repeats`` below 1 or ``warmup`` below 0, naming the value.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be at least 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup} must be at least 0")
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return times


def measure(
    fn: Callable,
    args: tuple,
    *,
    name: str,
    family: str = "",
    config: dict[str, Any] | None = None,
    variants: Sequence[tuple[str, tuple]] = (),
    repeats: int = MIN_REPEATS,
    dispatch_calls: int = 100,
    device_time: bool | None = None,
    bandwidth: float | None = None,
) -> Measurement:
    """Measures ``jax.jit(fn)`` on ``args``; see the module docstring.

    Args:
        fn: a pure function of ``args`` (pytrees of arrays; equinox modules included).
        args: the arguments of the measured call (e.g. step 0, key 0).
        variants: ``(label, args)`` for other steps and keys: each is called through the same
            ``jax.jit(fn)`` after ``args``, and every compile it causes is counted as a recompile.
        repeats: timed calls (at least 20).
        dispatch_calls: calls dispatched back to back for the dispatch rate.
        device_time: read the device's time per call from a profiler trace; default: on a GPU or
            TPU only.
        bandwidth: the copy bandwidth to compare with (bytes/s); default ``copy_bandwidth()``.

    Raises:
        ValueError: ``repeats`` below 20 or ``dispatch_calls`` below 1, naming the value.
    """
    if repeats < MIN_REPEATS:
        raise ValueError(f"repeats={repeats}: a distribution needs at least {MIN_REPEATS} calls")
    if dispatch_calls < 1:
        raise ValueError(f"dispatch_calls={dispatch_calls} must be at least 1")
    jitted = jax.jit(fn)
    start = time.perf_counter()
    traced = jitted.trace(*args)
    traced_at = time.perf_counter()
    lowered = traced.lower()
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()

    # the first run (allocations, autotuning) is not timed
    run = distribution(call_times(lambda: compiled(*args), repeats=repeats, warmup=1)) | {"timing": "wall"}

    device_run = None
    if device_time if device_time is not None else accelerator():
        per_call = device_seconds(compiled, args, calls=repeats)
        device_run = distribution(per_call) | {"timing": "device (jax.profiler trace)"}

    jax.block_until_ready(jitted(*args))  # jit's own cache: AOT compiles do not fill it
    t0 = time.perf_counter()
    out = None
    for _ in range(dispatch_calls):
        out = jitted(*args)
    jax.block_until_ready(out)
    elapsed = time.perf_counter() - t0
    dispatch = {"calls": dispatch_calls, "seconds": elapsed, "calls_per_s": dispatch_calls / elapsed}

    by_variant = variant_compiles(jitted, variants)
    cost, memory = cost_of(compiled), memory_of(compiled)
    bandwidth = bandwidth if bandwidth is not None else copy_bandwidth()
    seconds = (device_run or run)["median_s"]
    fraction = out_fraction = None
    if "bytes_accessed" in cost and seconds > 0:
        fraction = cost["bytes_accessed"] / seconds / bandwidth
    if "output_bytes" in memory and seconds > 0:
        out_fraction = memory["output_bytes"] / seconds / bandwidth
    return Measurement(
        name=name,
        family=family or name,
        config=dict(config or {}),
        trace_s=traced_at - start,
        lower_s=lowered_at - traced_at,
        compile_s=compiled_at - lowered_at,
        run=run,
        device_run=device_run,
        dispatch=dispatch,
        recompiles=sum(by_variant.values()),
        recompiles_by_variant=by_variant,
        cost=cost,
        memory=memory,
        bandwidth_fraction=fraction,
        output_bandwidth_fraction=out_fraction,
    )
