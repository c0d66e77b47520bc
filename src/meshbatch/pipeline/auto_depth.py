"""The prefetch depth from measured times (``Prefetcher(depth="auto")``, ``Pipeline(prefetch="auto")``)."""

from __future__ import annotations

import numpy as np

from .telemetry import RECENT, StreamLog


class AutoDepth:
    """The prefetch depth from measured times: steps in the making cover the time to make one.

    Rule (re-evaluated by a worker after each step it makes, from the last ``window`` measurements)::

        depth = clamp(ceil(make_max / step_min) + 1, min_depth, max_depth)

    ``make`` is how long a worker takes to make one step (its reads, with their latency, the host
    work, and the time it was held back for its turn, ``shadow.py``), ``step`` the consumer's time
    between two ``next`` calls. Reads of step ``k + d`` are then under way while step ``k`` is
    consumed. The worst case on both sides counts: the slowest recent step to make (the steps that
    start a new shuffle window read all its blocks at once, and a depth sized for the others
    stalls there) against the quickest recent consumer steps (a run of short training steps comes
    for a batch sooner than typical ones). Example: most steps take 0.15 s to make, those that
    open a window 0.45 s; training steps of 0.2-0.3 s -> ceil(2.25) + 1 = 4 steps in the making,
    by 4 threads. Until
    ``window // 4`` steps are measured, the depth stays at ``initial``. An explicit
    integer ``depth`` (``Pipeline(prefetch=8)``) overrides the rule. The measurements are the
    stream's ``recent_*`` windows, which ``reset_stats`` (a report window) does not clear.
    """

    min_depth = 2

    def __init__(self, *, max_depth: int = 8, initial: int = 4, window: int = 32):
        if not 1 <= window <= RECENT:
            raise ValueError(f"window must be in [1, {RECENT}] (got window={window})")
        self.max_depth, self.window = max_depth, window
        self.initial = min(max(initial, self.min_depth), max_depth)

    def depth(self, log: StreamLog) -> int:
        made, asked = list(log.recent_made)[-self.window :], list(log.recent_asked)[-self.window :]
        if len(made) < max(2, self.window // 4) or len(asked) < 3:
            return self.initial
        make = max(made)
        step = float(np.min(np.diff(asked)))
        wanted = int(np.ceil(make / max(step, 1e-6))) + 1
        return min(max(wanted, self.min_depth), self.max_depth)
