"""Bounded waits for what another writer commits: one polling loop for every wait on a cache.

A reader waiting for a writer (a first commit, more rows, a finished ledger) checks, backs off from
``FIRST_DELAY_S`` (20 ms) to ``MAX_DELAY_S`` (1 s) between checks (one ledger read a second at
most on an object store, once the wait is long), logs a line every ``LOG_EVERY_S`` seconds, raises
the writer's reported failure as soon as there is one, and raises ``CacheWaitTimeout`` after
``MESHBATCH_CACHE_WAIT_S`` seconds (an environment variable; default 86400, one day)::

    poll_until(lambda: ledger if finished else None, path="cache/owt/train",
               status=lambda: "is not finished (no ledger)", why="process 0 builds it")
    # checks at 0, 0.02, 0.06, 0.14, 0.30, 0.62, 1.26, 2.26, 3.26 ... s; returns the first value
    # that is not None, or raises: CacheWaitTimeout: cache cache/owt/train is not finished
    # (no ledger) after waiting 86400.0 s (process 0 builds it); the bound is MESHBATCH_CACHE_WAIT_S=86400
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)
WAIT_ENV = "MESHBATCH_CACHE_WAIT_S"
DEFAULT_WAIT_S = 86_400.0
LOG_EVERY_S = 60.0
FIRST_DELAY_S, MAX_DELAY_S = 0.02, 1.0
T = TypeVar("T")


class CacheWaitTimeout(TimeoutError):
    """A wait for another writer's commits passed its bound (``MESHBATCH_CACHE_WAIT_S``)."""


def env_seconds(name: str, default: float) -> float:
    """The seconds the environment variable ``name`` gives (``default`` when it is unset or empty).

    Raises:
        ValueError: the variable is set to something other than a finite number of seconds > 0.
    """
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds > 0 (got {name}={raw!r})")
    return value


def wait_seconds() -> float:
    """The bound on a wait for another writer (``MESHBATCH_CACHE_WAIT_S``, default one day)."""
    return env_seconds(WAIT_ENV, DEFAULT_WAIT_S)


def poll_until(
    ready: Callable[[], T | None],
    *,
    path: str,
    status: Callable[[], str],
    why: str,
    failure: Callable[[], BaseException | None] | None = None,
    timeout: float | None = None,
    hint: str = "",
) -> T:
    """Calls ``ready()`` until it returns something other than None, and returns that.

    Args:
        ready: the check; a value (not None) ends the wait.
        path: the cache waited for, named in the log line and the timeout.
        status: what the cache holds now, for the log and the timeout ("is not finished (no ledger)").
        why: who is expected to write it ("process 0 builds it").
        failure: the writer's reported failure, checked after each ``ready()``: an exception
            returned is raised at once.
        timeout: the bound in seconds (default ``wait_seconds()``).
        hint: appended to the timeout's message (what to check).

    Raises:
        CacheWaitTimeout: ``ready()`` gave nothing for ``timeout`` seconds; names ``path``, the
            status, the time waited and the bound.
    """
    timeout = wait_seconds() if timeout is None else timeout
    start = time.monotonic()
    logged, delay = start, FIRST_DELAY_S
    while True:
        value = ready()
        if value is not None:
            return value
        error = None if failure is None else failure()
        if error is not None:
            raise error
        waited = time.monotonic() - start
        if waited >= timeout:
            raise CacheWaitTimeout(
                f"cache {path} {status()} after waiting {waited:.1f} s ({why}); the bound is "
                f"{WAIT_ENV}={timeout:g}{hint}"
            )
        if time.monotonic() - logged >= LOG_EVERY_S:
            logged = time.monotonic()
            logger.info("meshbatch: waiting for cache %s (%s; %s): %.0f s of %g s", path, status(), why,
                        waited, timeout)  # fmt: skip
        time.sleep(min(delay, timeout - waited))
        delay = min(2 * delay, MAX_DELAY_S)
