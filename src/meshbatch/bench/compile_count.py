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
REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
# jax.monitoring's duration events of one compile's stages -> the names bench reports them under
STAGES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    BACKEND_COMPILE: "compile_s",
}


class _Programs:
    """Counts programs obtained: one per backend compile or persistent-cache hit. JAX 0.10 also
    times a cache hit as a backend compile (the hit, then the duration, in one thread); earlier
    versions do not. A hit therefore marks its thread until that thread's duration event or its
    next compile request (``compile_requests_use_cache``), so each program counts once."""

    def __init__(self, this_thread: bool):
        self.me = threading.get_ident() if this_thread else None
        self.events: list[str] = []
        self._hit: set[int] = set()

    def _mine(self) -> int | None:
        thread = threading.get_ident()
        return thread if self.me is None or thread == self.me else None

    def event(self, name, **kwargs) -> None:
        thread = self._mine()
        if thread is None:
            return
        if name == REQUEST:
            self._hit.discard(thread)
        elif name == CACHE_HIT:
            self._hit.add(thread)
            self.events.append(name)

    def duration(self, name, seconds, **kwargs) -> None:
        thread = self._mine()
        if thread is None or name != BACKEND_COMPILE:
            return
        if thread in self._hit:  # the hit's own timing (JAX >= 0.10): counted at the hit
            self._hit.discard(thread)
        else:
            self.events.append(name)

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        jax.monitoring.register_event_duration_secs_listener(self.duration)
        jax.monitoring.register_event_listener(self.event)
        try:
            yield
        finally:
            jax.monitoring.unregister_event_duration_listener(self.duration)
            jax.monitoring.unregister_event_listener(self.event)


@contextlib.contextmanager
def count_compiles(*, this_thread: bool = False) -> Iterator[list[str]]:
    """Yields a list that collects one entry per program compiled (or read back from the
    persistent compilation cache) inside the block; with ``this_thread``, only those of the
    calling thread."""
    programs = _Programs(this_thread)
    with programs.listening():
        yield programs.events


def variant_compiles(jitted, variants) -> dict[str, int]:
    """Programs each ``(label, args)`` variant makes an already-called ``jitted`` compile again."""
    out = {}
    for label, variant in variants:
        with count_compiles() as compiled:
            jax.block_until_ready(jitted(*variant))
        out[label] = len(compiled)
    return out


@contextlib.contextmanager
def compile_seconds(*, this_thread: bool = False) -> Iterator[dict[str, float]]:
    """Yields ``{"trace_s", "lower_s", "compile_s", "compiles"}`` summed over the compiles inside
    the block (``compiles`` counts programs as ``count_compiles`` does; ``compile_s`` includes
    the time to read a program back from the persistent compilation cache)."""
    totals = {"trace_s": 0.0, "lower_s": 0.0, "compile_s": 0.0, "compiles": 0}
    programs = _Programs(this_thread)

    def duration(name, seconds, **kwargs):
        if name in STAGES and programs._mine() is not None:
            totals[STAGES[name]] += float(seconds)

    jax.monitoring.register_event_duration_secs_listener(duration)
    try:
        with programs.listening():
            yield totals
            totals["compiles"] = len(programs.events)
    finally:
        jax.monitoring.unregister_event_duration_listener(duration)
