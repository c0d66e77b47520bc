"""Counting what JAX compiles: the evidence that a program never recompiles across steps or keys.

``count_compiles()`` collects one entry per program JAX had to obtain inside its block, whether
XLA compiled it or the persistent compilation cache served it from disk (a cache hit is a
recompile too: the program was not in memory). ``compile_seconds()`` collects the durations of
the three stages of each compile (trace, lower to MLIR, backend compile), as JAX reports them.

    with count_compiles() as compiled:
        for step in range(24):
            pipeline.batch(step)
    assert len(compiled) == 0            # nothing compiled after the first step

Both listen to ``jax.monitoring``: they see every thread's compiles unless ``this_thread`` (a
prefetch worker or a warm-up compiles in its own thread).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import jax

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"
# jax.monitoring's duration events of one compile's stages -> the names bench reports them under
STAGES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    BACKEND_COMPILE: "compile_s",
}


@contextlib.contextmanager
def count_compiles(*, this_thread: bool = False) -> Iterator[list[str]]:
    """Yields a list that collects one entry per program compiled (or read back from the
    persistent compilation cache) inside the block; with ``this_thread``, only those of the
    calling thread."""
    events: list[str] = []
    me = threading.get_ident()

    def mine() -> bool:
        return not this_thread or threading.get_ident() == me

    def duration(name, seconds, **kwargs):
        if name == BACKEND_COMPILE and mine():
            events.append(name)

    def hit(name, **kwargs):
        if name == CACHE_HIT and mine():
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(duration)
    jax.monitoring.register_event_listener(hit)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(duration)
        jax.monitoring.unregister_event_listener(hit)


@contextlib.contextmanager
def compile_seconds(*, this_thread: bool = False) -> Iterator[dict[str, float]]:
    """Yields ``{"trace_s", "lower_s", "compile_s", "compiles"}`` summed over the compiles inside
    the block (``compiles`` counts backend compiles and persistent-cache hits)."""
    totals = {"trace_s": 0.0, "lower_s": 0.0, "compile_s": 0.0, "compiles": 0}
    me = threading.get_ident()

    def duration(name, seconds, **kwargs):
        if name in STAGES and (not this_thread or threading.get_ident() == me):
            totals[STAGES[name]] += float(seconds)
            if name == BACKEND_COMPILE:
                totals["compiles"] += 1

    def hit(name, **kwargs):
        if name == CACHE_HIT and (not this_thread or threading.get_ident() == me):
            totals["compiles"] += 1

    jax.monitoring.register_event_duration_secs_listener(duration)
    jax.monitoring.register_event_listener(hit)
    try:
        yield totals
    finally:
        jax.monitoring.unregister_event_duration_listener(duration)
        jax.monitoring.unregister_event_listener(hit)
