"""Host time of a step by phase (plan, fetch, place, build, ...), for a caller that asks.

``Pipeline`` marks its phases with ``phase(name)``; nothing is recorded unless the current thread
is inside ``phase_times()``, which collects the seconds each phase took (summed if it recurs):

    with phase_times() as times:
        pipeline.batch(step)
    times  # {"plan": 0.0021, "fetch": 0.0043, "build": 0.0012, "global": 0.0004}

Phases time the host's calls only: a build dispatched asynchronously is done when its arrays are
ready (``jax.block_until_ready``), which the caller times itself.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

_local = threading.local()


@contextlib.contextmanager
def phase_times() -> Iterator[dict[str, float]]:
    """Collects, in a dict, the seconds each phase marked by this thread takes within the block."""
    outer = getattr(_local, "times", None)
    _local.times = times = {}
    try:
        yield times
    finally:
        _local.times = outer


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Marks the block as phase ``name`` of the current thread's step (free when nobody asks)."""
    times = getattr(_local, "times", None)
    if times is None:
        yield
        return
    began = time.perf_counter()
    try:
        yield
    finally:
        times[name] = times.get(name, 0.0) + time.perf_counter() - began
