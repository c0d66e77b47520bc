"""Counting XLA backend compiles: the evidence that a kernel never recompiles across steps."""

import contextlib

import jax


@contextlib.contextmanager
def count_compiles():
    """Yields a list that collects one entry per backend compile inside the block."""
    events = []

    def listener(name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
