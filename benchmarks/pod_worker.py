"""One process of bench_pod_batches.py's multi-process layout, and the pieces both sides share.

    python benchmarks/pod_worker.py PROCESS NUM_PROCESSES PORT LOCAL_DEVICES CACHE BATCH SEQ_LEN STEPS ALLOC

A worker joins a ``jax.distributed`` cluster (gloo, localhost), builds the benchmark's pipeline
over the global ``data`` mesh, makes steps ``0 .. STEPS - 1`` once (compiles, fills its block
cache) and prints one JSON line: the digest of every addressable shard of every step's batch.
Then each ``together`` or ``turns`` line on stdin makes the same steps again, timed
(``timed_steps``), and prints their times as one JSON line: ``together``, every process starts
each step at once (they share this machine's cores, as they would not on a pod); ``turns``, one
process makes a step while the others wait (each as on a host of its own; a step needs nothing
from another process). ``quit`` or the end of stdin (the benchmark gone) ends it. With ALLOC
``keep`` it asks glibc to keep freed memory (``harness.keep_freed_memory``), as the benchmark does
unless ``--system-malloc``; ``system`` leaves glibc's defaults.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import sys
import time

import numpy as np

ROUND_TIMEOUT_S = 600  # a worker waits at most this long for the next command


def make_pipeline(path: str, mesh, batch: int, seq_len: int):
    """The benchmark's pipeline: a block shuffle over the cache through a ``BlockCache`` big
    enough to keep all of it after a first pass (so what is timed is host work, not the disk)."""
    from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
    from meshbatch.cache import BlockCache, TokenCache

    cache = TokenCache.open(path, block_cache=BlockCache(2 << 30, block_tokens=256 * seq_len))
    spec = ShuffleSpec("block", io_block_size=256, window_blocks=4)
    return Pipeline(CausalLMDataset(cache, seq_len, shuffle=spec), mesh=mesh, batch_size=batch, key=0)


def timed_steps(pipeline, steps: int, before=None, after=None) -> list[dict[str, float]]:
    """Each step made with ``pipeline.batch`` and waited for: ``{"total": s, phase: s, ...,
    "wait": s}`` per step (``meshbatch.pipeline.telemetry``; ``wait`` is until the arrays are ready).
    ``before()`` and ``after()``, if given, run around each step, untimed (barriers)."""
    import jax

    from meshbatch.pipeline.telemetry import phase_times

    out = []
    for step in range(steps):
        if before is not None:
            before()
        began = time.perf_counter()
        with phase_times() as times:
            batch = pipeline.batch(step)
        made = time.perf_counter()
        jax.block_until_ready(batch)
        times["wait"] = time.perf_counter() - made
        times["total"] = time.perf_counter() - began
        out.append(times)
        if after is not None:
            after()
    return out


def digest(array: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=16).hexdigest()


def shard_digests(batch) -> dict[str, str]:
    """``"leaf/first-last" -> digest`` of every addressable shard of every leaf (global rows)."""
    out = {}
    for field in dataclasses.fields(batch):
        leaf = getattr(batch, field.name)
        if leaf is None:
            continue
        for shard in leaf.addressable_shards:
            first, last, _ = shard.index[0].indices(leaf.shape[0])
            out[f"{field.name}/{first}-{last}"] = digest(np.asarray(shard.data))
    return out


def row_digests(batch, keys) -> dict[str, str]:
    """The digests ``shard_digests`` would give for ``keys`` of a fully addressable batch."""
    out = {}
    for key in keys:
        name, rows = key.split("/")
        first, last = (int(v) for v in rows.split("-"))
        out[key] = digest(np.asarray(getattr(batch, name))[first:last])
    return out


def summarize(steps: list[dict[str, float]]) -> dict[str, float]:
    """Median seconds of each phase (and of the total) over ``steps``."""
    names = sorted({name for step in steps for name in step})
    return {name: statistics.median(step.get(name, 0.0) for step in steps) for name in names}


def barriers(mode: str, process_id: int, processes: int) -> tuple:
    """``(before, after)`` for ``timed_steps``: every process starts a step at once
    (``together``), or in turns: barriers ``0 .. processes`` around each step, every process
    passing each one, process ``p`` making its step between barriers ``p`` and ``p + 1``."""
    from jax.experimental.multihost_utils import sync_global_devices

    if mode == "together":
        return (lambda: sync_global_devices("step"), None)

    def passing(turns: range) -> None:
        for turn in turns:
            sync_global_devices(f"turn {turn}")

    return (
        lambda: passing(range(process_id + 1)),
        lambda: passing(range(process_id + 1, processes + 1)),
    )


def _send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    import os
    import select

    process_id, num_processes, port, local_devices = (int(a) for a in sys.argv[1:5])
    path, batch, seq_len, steps = sys.argv[5], *(int(a) for a in sys.argv[6:9])
    allocator = sys.argv[9]
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local_devices}"
    import jax
    from harness import keep_freed_memory

    if allocator == "keep":
        keep_freed_memory()

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"localhost:{port}", num_processes=num_processes, process_id=process_id, initialization_timeout=120
    )
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    pipeline = make_pipeline(path, mesh, batch, seq_len)
    digests = {str(step): shard_digests(pipeline.batch(step)) for step in range(steps)}
    _send({"digests": digests})
    try:
        while True:
            ready, _, _ = select.select([sys.stdin], [], [], ROUND_TIMEOUT_S)
            command = sys.stdin.readline().strip() if ready else ""
            if command not in ("together", "turns"):
                break
            _send({"steps": timed_steps(pipeline, steps, *barriers(command, process_id, num_processes))})
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
