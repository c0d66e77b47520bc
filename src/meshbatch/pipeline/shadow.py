"""When producers do host work: in the shadow of the consumer's step.

A producer's host work (planning, copying tokens, dispatching the build: Python and numpy that hold
the GIL, on the cores the consumer runs on) delays the consumer when it runs just as the consumer
asks for its next batch, or just after it took one (when it dispatches its training step): a
thread that wants the GIL while another runs Python waits up to the switch interval (5 ms) for it.
Reads are not host work here: they wait on the store with the GIL released, any time.

Rule, with ``t`` the consumer's latest take and ``away_min``/``away_max`` the shortest and longest
of its last ``window`` times away (from taking a batch to asking for the next)::

    host work may start in  [t + f * away_min, t + (1 - f) * away_min]        f = 0.1
    or once                 t + (1 + f) * away_max  has passed (the consumer pauses: an eval, a save)
    or while the consumer waits in next(), or before ``min_steps`` times away are measured.

Work started in the window runs to its end, so the window closes early enough for it: its last
start is ``(1 - f) * away_min - work``, ``work`` the longest of the recent host-work pieces after a
step's reads (copies into place, stacking, the build), measured by ``record_work`` - but the
window stays at least ``[f, 2 f] * away_min`` long. (Otherwise a 10 ms piece started at 0.89 of a
100 ms step runs past the consumer's next ask, which then waits a GIL switch interval.)

    (min_steps=2) takes at 0.00, 0.31, 0.52, asks at 0.30, 0.50: away 0.30, 0.19 -> min 0.19, max 0.30
    at 0.525: wait 0.014 s (until 0.52 + 0.019)      at 0.60: start (window ends 0.52 + 0.171)
    at 0.70: wait for the next take, at most until 0.52 + 0.33 = 0.85
    pieces of host work measured at 0.05 s: the window closes at 0.52 + 0.171 - 0.05 = 0.641
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

_local = threading.local()


class Shadow:
    """The consumer's takes and times away, and when host work may start (see the module docstring).

    Not thread-safe by itself: ``_Workers`` calls it under its lock.
    """

    def __init__(self, *, fraction: float = 0.1, window: int = 32, min_steps: int = 4):
        if not 0 < fraction < 0.5:
            raise ValueError(f"fraction must be in (0, 0.5) (got fraction={fraction})")
        self.fraction, self.min_steps = fraction, min_steps
        self.away: collections.deque[float] = collections.deque(maxlen=window)
        self.taken: float | None = None  # when the consumer took its latest batch
        self.waiting = False  # the consumer waits in next() for a batch
        self.work: collections.deque[float] = collections.deque(maxlen=window)  # host-work pieces

    def record_work(self, seconds: float) -> None:
        """A piece of host work after a step's reads took ``seconds``."""
        self.work.append(seconds)

    def asked(self, now: float) -> None:
        """The consumer asks for a batch (at ``now``)."""
        if self.taken is not None:
            self.away.append(now - self.taken)

    def took(self, now: float) -> None:
        """The consumer took a batch (at ``now``)."""
        self.taken, self.waiting = now, False

    def wait_s(self, now: float) -> float:
        """Seconds until host work may start at ``now``: 0 to start now; a positive number is a
        bound (a take or a wait of the consumer may open the window sooner)."""
        if self.waiting or self.taken is None or len(self.away) < self.min_steps:
            return 0.0
        f, since = self.fraction, now - self.taken
        low, high = min(self.away), max(self.away)
        if since < f * low:
            return f * low - since
        last = max((1 - f) * low - max(self.work, default=0.0), 2 * f * low)  # the work fits before
        if since <= last or since >= (1 + f) * high:
            return 0.0
        return (1 + f) * high - since


def bind_turn(wait: Callable[[], None] | None, done: Callable[[], None] | None = None) -> None:
    """Makes ``wait`` what ``wait_turn`` calls in this thread (a producer thread of a stream), and
    ``done`` what ``host_work_done`` calls."""
    _local.wait, _local.done = wait, done


def wait_turn() -> None:
    """Called by a producer before host work: returns when the stream's ``Shadow`` rule lets it
    start (at once outside a stream, e.g. ``Pipeline.batch``)."""
    wait = getattr(_local, "wait", None)
    if wait is not None:
        wait()


def host_work_done() -> None:
    """Called by a producer where its host work for a step ends (before it waits on accelerators,
    which the consumer's cores do not feel), so the piece ``Shadow.record_work`` sees is the host's."""
    done = getattr(_local, "done", None)
    if done is not None:
        done()
