"""Carried state, step to step: a stateful dataset's plans made in step order, once each.

The token-balanced interleave decides each row from the counts all earlier rows left, so step
``k``'s plan needs the state after step ``k - 1``. Prefetch workers make steps concurrently; this
planner serialises only the (cheap) planning: whichever worker asks first plans every step up to
its own, in order, and keeps the plans and states the others will ask for:

    states = {0: s0}; worker B asks for step 1 before worker A asks for step 0
    B plans step 0 (keeps plan0, s1) then step 1 (keeps s2) -> A takes plan0 without planning

A state is known from the start (``init_state``), from a checkpoint, or by planning forward from
an earlier known state; nothing is ever planned backwards. The state the planner started from
(step 0's, or a loaded checkpoint's) is always kept, so a stream can restart there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from meshbatch.datasets.protocol import Plan, State

logger = logging.getLogger(__name__)

KEEP = 64  # steps behind the one asked for whose plans and states a long replay keeps
PROGRESS_S = 10.0  # seconds between progress lines of a long replay


class StatePlanner:
    """Plans of a stateful dataset by step, threading its state; safe to call from any thread.

    Args:
        plan_step: ``(step, state) -> (plan, state after the step)``.
        step: the step whose starting state is ``state``.
        state: the state at the start of ``step``.

    Attributes:
        planned: steps planned so far (``plan_step`` calls): a resume from a checkpoint plans only
            the steps it takes, a replay every step since the last known state.
    """

    def __init__(self, plan_step: Callable[[int, State], tuple[Plan, State]], step: int, state: State):
        self._plan_step = plan_step
        self._lock = threading.Lock()
        self._anchor = (step, state)
        self._states: dict[int, State] = {step: state}
        self._made: dict[int, Plan] = {}
        self.planned = 0

    def reset(self, step: int, state: State) -> None:
        """Forget everything; ``state`` is the state at the start of ``step``."""
        with self._lock:
            self._anchor = (step, state)
            self._states = {step: state}
            self._made = {}

    def plan(self, step: int) -> Plan:
        """The plan of ``step``, planning forward from the latest known state before it."""
        with self._lock:
            made = self._made.pop(step, None)
            if made is not None:
                return made
            return self._advance(step)

    def state(self, step: int) -> State:
        """The state at the start of ``step``."""
        with self._lock:
            if step not in self._states:
                self._advance(step - 1)
            return self._states[step]

    def warn_if_replay(self, step: int) -> None:
        """Says so in one WARNING line when the state at ``step`` is not known: a consumer starting
        there (a resume without a ``state_dict``) makes the planner replay every step since the
        latest state it knows, however few."""
        with self._lock:
            if step in self._states:
                return
            known = [s for s in self._states if s < step]
            if known:
                base = max(known)
                logger.warning(
                    "planning steps %d..%d to rebuild the state of step %d (no state_dict for it: "
                    "resume with Pipeline(state=...) or iterate_from(state=...) to plan no replay)",
                    base, step - 1, step,
                )  # fmt: skip

    def forget_before(self, step: int) -> None:
        """Drop what no one will ask for once the consumer is at ``step``."""
        with self._lock:
            if step in self._states:
                self._states = {s: state for s, state in self._states.items() if s >= step}
                self._states.setdefault(*self._anchor)
            self._made = {s: plan for s, plan in self._made.items() if s >= step}

    def _advance(self, step: int) -> Plan:
        known = [s for s in self._states if s <= step]
        if not known:
            raise ValueError(
                f"the state at step {step} is not known (the earliest known state is at step "
                f"{min(self._states)}): resume from a state_dict() saved at or before it"
            )
        base = max(known)
        long = step - base > KEEP  # progress lines (the replay itself is announced by warn_if_replay)
        state, started = self._states[base], time.monotonic()
        reported = started
        for s in range(base, step + 1):
            plan, state = self._plan_step(s, state)
            self.planned += 1
            if long and time.monotonic() - reported >= PROGRESS_S:
                reported = time.monotonic()
                logger.info("replaying plans: step %d of %d..%d (%.0f s)", s, base, step, reported - started)
            if step - s <= KEEP:
                self._states[s + 1] = state
                if s < step:
                    self._made[s] = plan
        return plan
