"""Counting compiles: the evidence that a kernel never recompiles across steps.

A program JAX had to obtain counts once, whether XLA compiled it or the persistent compilation
cache (on in the tests, see conftest) served it from disk: a cache hit is a recompile too.
"""

import contextlib
import threading

import jax


@contextlib.contextmanager
def count_compiles(*, this_thread: bool = False):
    """Yields a list that collects one entry per backend compile inside the block; with
    ``this_thread``, only the compiles of the calling thread (a stream or warm-up another test left
    running in this worker compiles in its own threads)."""
    events = []
    me = threading.get_ident()

    def mine() -> bool:
        return not this_thread or threading.get_ident() == me

    def listener(name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration" and mine():
            events.append(name)

    def hit(name, **kwargs):
        if name == "/jax/compilation_cache/cache_hits" and mine():
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    jax.monitoring.register_event_listener(hit)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        jax.monitoring.unregister_event_listener(hit)
