"""The whole pipeline step measured: a causal-window ``Pipeline`` over a scratch token cache.

first step        its seconds, and the trace / lower / compile seconds of every program it
                  compiled (jax.monitoring's per-stage durations), and how many
steady steps      ``pipeline.batch(step)`` + ``block_until_ready`` over >= 20 steps: median,
                  p10, p90; host seconds by phase (plan, fetch, stack, build, global)
recompiles        compiles over those steps (must be 0) and for a second pipeline with
                  another key (must be 0: the programs are shared)
throughput        steps/s of ``iterate_from`` with its default prefetch (the dispatch mode)
bytes             TensorStore bytes read per step; the build program's cost / memory analysis
"""

from __future__ import annotations

import logging
import time

import jax
import numpy as np
from jax.sharding import Mesh

from meshbatch.cache import CacheWriter, TokenCache
from meshbatch.datasets import CausalLMDataset
from meshbatch.pipeline import Pipeline
from meshbatch.pipeline.telemetry import phase_times, read_counters
from meshbatch.shuffles import ShuffleSpec

from .compile_count import compile_seconds, count_compiles
from .kernel_cases import Shapes
from .measure import MIN_REPEATS, cost_of, distribution, memory_of

logger = logging.getLogger(__name__)
MAX_CACHE_TOKENS = 1 << 25


def write_scratch_cache(path: str, tokens: int, *, seed: int = 0) -> TokenCache:
    """A token cache of at least ``tokens`` tokens of documents of 64-4096 random ids (seeded)."""
    rng = np.random.default_rng(seed)
    with CacheWriter(path, flush_tokens=1 << 24) as writer:
        written = 0
        while written < tokens:
            docs = [rng.integers(2, 50000, int(rng.integers(64, 4096)), dtype=np.int32) for _ in range(256)]
            writer.write(docs)
            written += sum(d.size for d in docs)
    return TokenCache.open(path)


def cache_tokens(shapes: Shapes) -> int:
    """Tokens of the scratch cache: 16 steps' worth, at most 2^25, at least two windows a row."""
    return max(2 * shapes.rows * shapes.seq_len, min(16 * shapes.rows * shapes.seq_len, MAX_CACHE_TOKENS))


def measure_pipeline_step(cache: TokenCache, shapes: Shapes, *, repeats: int = MIN_REPEATS) -> dict:
    """The JSON row of the whole pipeline step (see the module docstring)."""
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
    rows = shapes.rows - shapes.rows % len(devices) or len(devices)
    dataset = CausalLMDataset(cache, shapes.seq_len, shuffle=ShuffleSpec("full"), eos_id=1)
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=rows, key=0, warmup=False)
    before = read_counters(dataset)
    with compile_seconds() as stages:
        start = time.perf_counter()
        jax.block_until_ready(pipeline.batch(0))
        first = time.perf_counter() - start
    times, phases = [], []
    with count_compiles() as across_steps:
        for step in range(1, repeats + 1):
            with phase_times() as phase:
                t0 = time.perf_counter()
                jax.block_until_ready(pipeline.batch(step))
                times.append(time.perf_counter() - t0)
            phases.append(dict(phase))
    read = read_counters(dataset)
    other = Pipeline(dataset, mesh=mesh, batch_size=rows, key=1, warmup=False)
    with count_compiles() as across_keys:
        jax.block_until_ready(other.batch(0))
    steps = max(repeats, 8)
    with pipeline.iterate_from(repeats + 1) as stream:
        next(stream)  # the stream's first batch waits for its workers to start
        t0 = time.perf_counter()
        for _ in range(steps):
            jax.block_until_ready(next(stream))
        elapsed = time.perf_counter() - t0
    # the build program of the next step, its inputs made as ``Pipeline._make`` makes them
    layout = pipeline._layouts[rows]
    kernel, _ = pipeline._build[rows]
    compiled = kernel.lower(pipeline._build_arrays, *pipeline._host_inputs(repeats + 1, layout)).compile()
    names = sorted({k for p in phases for k in p})
    return {
        "name": "pipeline_step",
        "family": "pipeline step",
        "config": {
            "rows": rows,
            "seq_len": shapes.seq_len,
            "devices": len(devices),
            "shuffle": "full",
            "cache_tokens": cache.num_tokens,
            "prefetch": pipeline.prefetch,
        },
        "first_step_s": first,
        "trace_s": stages["trace_s"],
        "lower_s": stages["lower_s"],
        "compile_s": stages["compile_s"],
        "first_step_compiles": stages["compiles"],
        "run": distribution(times) | {"timing": "wall"},
        "device_run": None,
        "phases_median_s": {k: float(np.median([p.get(k, 0.0) for p in phases])) for k in names},
        "dispatch": {
            "calls": steps,
            "seconds": elapsed,
            "calls_per_s": steps / elapsed,
            "mode": "iterate_from (prefetch)",
        },
        "recompiles": len(across_steps) + len(across_keys),
        "recompiles_by_variant": {f"steps 1-{repeats}": len(across_steps), "key 1": len(across_keys)},
        "bytes_read_per_step": (read["bytes_read"] - before["bytes_read"]) / (repeats + 1),
        "reads_per_step": (read["reads_issued"] - before["reads_issued"]) / (repeats + 1),
        "cost": cost_of(compiled),
        "memory": memory_of(compiled),
        "bandwidth_fraction": None,
        "output_bandwidth_fraction": None,
    }
