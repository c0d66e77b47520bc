"""Pod-size batches: host time per step of 1024 x 4096 tokens on 1 to 8 devices and 2 processes x 4.

Method: one local cache (Zipf token ids, as ``bench_pipeline.py``), read by
``Pipeline(CausalLMDataset(cache, 4096, shuffle=block))`` through a ``BlockCache`` holding the
whole cache after a first pass (so what is timed is host work, not the disk). Layouts of the
same global batch: 1, 2, 4 and 8 virtual CPU devices in this process, and 2 local processes of 4
devices each (``pod_worker.py``: ``jax.distributed`` over gloo on localhost, one mesh of 8). Each
makes the same steps with ``pipeline.batch(step)`` and waits for the arrays, in rounds that rotate
the layouts' order. The two processes make each step in turns ("2x4 turns": each process alone on
this 2-core VM, as on a host of its own; a step needs nothing from the other process) and
together ("2x4 together": both at once, sharing the 2 cores); barriers around steps are untimed,
and a step of either takes as long as its slower process. Every process keeps freed memory for
reuse (``harness.keep_freed_memory``: a trainer's steady state; ``--system-malloc``: glibc's
defaults, where each step's fresh output pages are faulted in). Reported per layout: median and [min, max]
seconds per step over rounds (each round's median over its steps), the median of each host phase
(``meshbatch.pipeline.telemetry``: plan, fetch, stack, place, build call, global; ``wait`` is until
the arrays are ready: the build itself, which on CPU devices is also host work), and the bytes
each device receives. Batches are checked step by step: 2, 4, 8 devices' equal 1 device's, and every
shard each of the 2 processes holds has the digest of the same rows of 1 device's batch.

    python benchmarks/bench_pod_batches.py [--quick] [--system-malloc] [--timeout S]
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import jax
import numpy as np
from harness import banner, keep_freed_memory, write_json, write_zipf_cache
from pod_worker import make_pipeline, row_digests, summarize, timed_steps

VOCAB = 32_768
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pod_worker.py")
IN_PROCESS = (1, 2, 4, 8)  # devices of the one-process layouts (2 and 4 show the trend)
PHASES = ("plan", "fetch", "stack", "place", "build", "global", "wait")


class Workers:
    """``processes`` pod_worker.py processes on localhost; each answer is one JSON line, awaited
    at most ``timeout`` seconds. ``close()`` ends them (killed if they do not exit in 10 s)."""

    def __init__(self, processes: int, local_devices: int, args: list[str], timeout: float):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
        self.timeout, self.logs = timeout, [[] for _ in range(processes)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, WORKER, str(i), str(processes), str(port), str(local_devices), *args],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            for i in range(processes)
        ]  # fmt: skip
        self.answers = [queue.Queue() for _ in range(processes)]
        for i, proc in enumerate(self.procs):
            threading.Thread(target=self._read, args=(i, proc), daemon=True).start()

    def _read(self, i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("{"):
                self.answers[i].put(json.loads(line))
            else:
                self.logs[i].append(line)
        self.answers[i].put(None)  # the process ended

    def receive(self) -> list[dict]:
        deadline = time.monotonic() + self.timeout
        out = []
        for i, answers in enumerate(self.answers):
            try:
                answer = answers.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                answer = None
            if answer is None:
                log = "".join(self.logs[i][-40:])
                raise RuntimeError(f"worker {i} gave no answer within {self.timeout}s:\n{log}")
            out.append(answer)
        return out

    def ask(self, command: str) -> list[dict]:
        for proc in self.procs:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        return self.receive()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.stdin.write("quit\n")
                    proc.stdin.close()
                except OSError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def bytes_per_device(pipeline, devices: int) -> dict[str, float]:
    """MB each device receives from the host (the fetch buffer and span offsets) and holds (the
    batch's three int32 leaves)."""
    dataset, batch = pipeline.dataset, pipeline.schedule.batch_size(0)
    rows = batch // devices
    tokens = 2 * dataset.content_margin + rows * dataset.max_row_tokens
    return {
        "input_mb": (tokens + rows * dataset.spans_per_row) * 4 / 1e6,
        "batch_mb": rows * dataset.seq_len * 4 * 3 / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--system-malloc", action="store_true", help="keep glibc's allocator defaults")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds any worker answer may take")
    args = parser.parse_args()
    steps, rounds = (4, 2) if args.quick else (8, 5)
    payload = banner("bench_pod_batches")
    # a trainer's steady state (the workers do the same); --system-malloc: glibc's defaults
    payload["allocator"] = "glibc default" if args.system_malloc else keep_freed_memory()
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cache")
        write_zipf_cache(path, (steps + 1) * args.batch * args.seq_len, VOCAB)
        allocator = "system" if args.system_malloc else "keep"
        workers = Workers(
            2, 4, [path, str(args.batch), str(args.seq_len), str(steps), allocator], args.timeout
        )
        try:
            pipelines = {}
            for devices in IN_PROCESS:
                mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
                pipelines[str(devices)] = make_pipeline(path, mesh, args.batch, args.seq_len)
            # compiles, fills the block caches, checks every layout against 1 device, step by step
            remote = workers.receive()
            for step in range(steps):
                reference = pipelines["1"].batch(step)
                for devices in IN_PROCESS[1:]:
                    got = pipelines[str(devices)].batch(step)
                    for name in ("tokens", "loss_mask", "segment_ids"):
                        want = np.asarray(getattr(reference, name))
                        np.testing.assert_array_equal(np.asarray(getattr(got, name)), want)
                for i, answer in enumerate(remote):
                    got = answer["digests"][str(step)]
                    assert got == row_digests(reference, got), f"process {i} differs at step {step}"
            held = [len(answer["digests"]["0"]) for answer in remote]
            leaves = len(jax.tree.leaves(reference))
            assert len({k for a in remote for k in a["digests"]["0"]}) == 8 * leaves, "a shard is missing"
            print(
                f"{args.batch} x {args.seq_len}: batches on {IN_PROCESS[1:]} devices equal 1 device's; "
                f"the processes' {held} leaf shards equal 1 device's rows ({steps} steps)"
            )
            layouts = [*map(str, IN_PROCESS), "2x4 turns", "2x4 together"]
            per_round = {name: [] for name in layouts}
            step_log = {name: [] for name in layouts}
            for r in range(rounds):
                for name in layouts[r % len(layouts) :] + layouts[: r % len(layouts)]:
                    if name.startswith("2x4"):
                        answers = workers.ask(name.split()[1])
                        per_process = [answer["steps"] for answer in answers]
                        totals = [max(p[s]["total"] for p in per_process) for s in range(steps)]
                        step_log[name].append(per_process)
                    else:
                        times = timed_steps(pipelines[name], steps)
                        totals = [t["total"] for t in times]
                        step_log[name].append([times])
                    per_round[name].append(statistics.median(totals))
        finally:
            workers.close()
        load_end = os.getloadavg()
        table = {}
        for name in layouts:
            devices = 8 if name.startswith("2x4") else int(name)
            processes = len(step_log[name][0])
            phases = [
                summarize([step for log in step_log[name] for step in log[p]]) for p in range(processes)
            ]
            sizes = bytes_per_device(pipelines["1"], devices)
            table[name] = {
                "median_s": statistics.median(per_round[name]),
                "min_s": min(per_round[name]),
                "max_s": max(per_round[name]),
                "round_medians_s": per_round[name],
                "phases_s": phases,
                **sizes,
            }
            row = table[name]
            print(
                f"{name} device(s): {row['median_s'] * 1e3:.0f} ms per step "
                f"[{row['min_s'] * 1e3:.0f}, {row['max_s'] * 1e3:.0f}], each device receives "
                f"{row['input_mb']:.2f} MB, holds {row['batch_mb']:.2f} MB"
            )
            for p, phase in enumerate(phases):
                label = f"process {p}" if processes > 1 else "host"
                parts = ", ".join(f"{k} {phase[k] * 1e3:.1f}" for k in PHASES if k in phase)
                print(f"    {label} phases, ms (median over steps): {parts}")
        print(f"load average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
        payload.update(
            args=vars(args), steps=steps, rounds=rounds, table=table,
            load_average={"start": list(load), "end": list(load_end)},
        )  # fmt: skip
        write_json(__file__.replace(".py", "_system_malloc.py") if args.system_malloc else __file__, payload)


if __name__ == "__main__":
    main()
