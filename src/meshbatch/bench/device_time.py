"""The device's own time per call, read from a ``jax.profiler`` trace (GPU and TPU).

A wall-clock time around ``block_until_ready`` includes the host's dispatch and the wait for the
result; the device's time is what its streams (GPU) or cores (TPU) spent on the program. The
profiler records both: ``device_seconds`` runs the compiled program ``calls`` times inside
``jax.profiler.trace(..., create_perfetto_trace=True)`` and reads the Perfetto JSON it writes:

* the processes whose name names a device (``/device:GPU:0``, ``/device:TPU:0``);
* where they have an ``XLA Modules`` thread (TPU; GPU with module-level tracing), one event per
  execution of the program: the per-call device times;
* otherwise (GPU kernels on CUDA streams) every complete event on those processes, summed and
  split evenly over the calls: one mean device time per call, repeated ``calls`` times.

On a CPU the trace has no device process: there is nothing to read, and ``device_seconds``
raises; ``measure`` reports wall time there.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import tempfile
from collections import defaultdict

import jax


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
