"""Running a call that should fail rather than wait forever, with a bound on the wait."""

from __future__ import annotations

import threading
from collections.abc import Callable


def error_within(call: Callable[[], object], timeout_s: float, waiting: str) -> BaseException:
    """Runs ``call`` in a daemon thread and returns what it raised; fails the test if it is still
    running after ``timeout_s`` (``waiting`` says what it waits for) or returned without raising."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # the caller checks what was raised
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=timeout_s)
    assert not thread.is_alive(), f"after {timeout_s} s, {waiting}"
    assert raised, "the call returned without raising"
    return raised[0]
