"""Who builds a missing cache in a ``jax.distributed`` run, how its failure reaches the others, and
how they wait for it.

Process 0 (or a lone process: ``builds_here``) builds; every other process waits for the cache's
finished ledger (``wait_for_finished``: bounded by ``MESHBATCH_CACHE_WAIT_S``) and raises
``CacheBuildFailed`` with process 0's error as soon as process 0 reports one (``report_failure``,
through ``jax.distributed``'s key-value store)::

    clear_failure("gs://b/c/train")           # process 0, before it builds
    report_failure("gs://b/c/train", error)   # process 0, when its build raised
    wait_for_finished("gs://b/c/train")       # the others: the finished ledger, or CacheBuildFailed

Both ``build_once`` (local paths) and ``store_build`` (object stores) use it.
"""

from __future__ import annotations

import logging

from meshbatch.cache.builds.waiting import poll_until
from meshbatch.cache.format.ledger import Ledger, try_read_ledger

logger = logging.getLogger(__name__)


class CacheBuildFailed(RuntimeError):
    """The build of a cache this process waits for failed (its error, as its builder reported it)."""


def kv_client():
    """The ``jax.distributed`` key-value client, or None outside a distributed run."""
    from jax._src import distributed

    return distributed.global_state.client


def _failure_key(path: str) -> str:
    return f"meshbatch/cache_build_failed/{path}"


def report_failure(path: str, error: BaseException) -> None:
    """Process 0: tells the processes waiting for ``path`` that its build failed, and why."""
    client = kv_client()
    if client is None:
        return
    notes = "; ".join(getattr(error, "__notes__", ()))
    try:
        client.key_value_set(
            _failure_key(path), f"{type(error).__name__}: {error}"[:4000] + (f"; {notes}" if notes else "")
        )
    except Exception as why:  # e.g. already reported by an earlier attempt
        logger.warning(
            "meshbatch: could not report the failed build of %s to the other processes: %s", path, why
        )


def clear_failure(path: str) -> None:
    """Process 0, starting a build: forgets a failure reported by an earlier attempt in this run."""
    client = kv_client()
    if client is not None:
        try:
            client.key_value_delete(_failure_key(path))
        except Exception:  # nothing to forget
            pass


def reported_failure(path: str) -> str | None:
    """The failure process 0 reported for ``path``'s build, or None."""
    client = kv_client()
    if client is None:
        return None
    try:
        return client.key_value_try_get(_failure_key(path))
    except Exception:  # NOT_FOUND: nothing reported
        return None


def builds_here() -> bool:
    """Whether this process builds missing caches (process 0 of a ``jax.distributed`` run, or a
    lone process)."""
    import jax

    return jax.process_count() == 1 or jax.process_index() == 0


def wait_for_finished(path: str, *, timeout: float | None = None, why: str = "process 0 builds it") -> Ledger:
    """Polls ``path``'s ledger until it is finished (``poll_until``: backoff, a log line a
    minute); returns it.

    Raises:
        CacheWaitTimeout: not finished after ``timeout`` seconds (default ``wait_seconds()``).
        CacheBuildFailed: process 0 reported that its build failed.
    """
    seen: list[Ledger | None] = [None]

    def done() -> Ledger | None:
        seen[0] = try_read_ledger(path)
        return seen[0] if seen[0] is not None and seen[0].is_finished else None

    def status() -> str:
        rows = "no ledger" if seen[0] is None else f"{seen[0].total_num_rows} rows committed, unfinished"
        return f"is not finished ({rows})"

    def failure() -> CacheBuildFailed | None:
        reported = reported_failure(path)
        if reported is None:
            return None
        return CacheBuildFailed(f"process 0 failed to build cache {path} this process waits for: {reported}")

    hint = (
        ". With several processes, cache_dir must be storage every process sees, and process 0 "
        "must not have failed (see its log)"
    )
    return poll_until(done, path=path, status=status, why=why, failure=failure, timeout=timeout, hint=hint)
