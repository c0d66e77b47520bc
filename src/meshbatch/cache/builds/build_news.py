"""Claim and publish for a build (the package docstring tells who builds and who waits): the local
``flock``s, and the news a build leaves for its waiters, which build it is and how it ended.

The news goes two ways, read through one interface (``cache_id()``, ``failure()``): to the other
processes of a ``jax.distributed`` run through its key-value store (``RemoteNews``: keys
``meshbatch/quick_start_build/<path>``, set by ``announce``, and ``meshbatch/cache_build_failed/<path>``,
set by ``report_failure``), and to the other runs on this machine through a state file beside a
local cache (``LocalNews``). A quick-start build, which grows the cache in place, tells its readers
its ``cache_id`` so a reader opens only that build's rows (never a killed build's leftover at the
path, which the builder is about to delete).

On a local path only the run holding the path's build lock (``quick_start_lock``: an ``flock``
on ``.<split>.quick-start.lock``) builds; it writes ``{"cache_id": ...}`` to
``.<split>.quick-start.state`` beside it, and adds ``"error"`` when it ends unfinished. The state
file's own ``flock`` keeps the pair (lock held, state) consistent: a run takes the build lock and
writes the state holding it exclusively, a reader looks at both holding it shared, so it never
pairs a new build's lock with a killed build's state.

    lock = take_lock("cache/owt/train", "3f9c...")  # None: another run builds it
    news = LocalNews("cache/owt/train")              # in that other run
    news.cache_id()   # "3f9c..." (while the lock is held); the reader waits for its ledger
    release("cache/owt/train", lock, "3f9c...", QuickStartBuildError("the build was stopped ..."))
    news.failure()    # "QuickStartBuildError: the build was stopped ..."
"""

from __future__ import annotations

import fcntl
import json
import logging
import os

from meshbatch.cache.builds.waiting import poll_until
from meshbatch.cache.format.ledger import Ledger, try_read_ledger

logger = logging.getLogger(__name__)


class CacheBuildFailed(RuntimeError):
    """The build of a cache this process waits for failed (its error, as its builder reported it)."""


def builds_here() -> bool:
    """Whether this process builds missing caches (process 0 of a ``jax.distributed`` run, or a
    lone process)."""
    import jax

    return jax.process_count() == 1 or jax.process_index() == 0


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def lock_path(path: str) -> str:
    """``path``'s quick-start lock file: a hidden sibling (``file://`` paths are local paths)."""
    parent, name = os.path.split(os.path.abspath(path.removeprefix("file://")))
    return os.path.join(parent, f".{name}.quick-start.lock")


def flock(path: str, mode: int = fcntl.LOCK_EX, *, wait: bool = True, opening: str = "a"):
    """``path`` opened (``opening``) and ``flock``ed (``LOCK_EX``, or ``LOCK_SH`` to read), or
    ``None`` when ``wait`` is false and another process holds it: every local lock of a build. The
    lock goes with the file (``close``) or the process."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    f = open(path, opening)
    try:
        fcntl.flock(f.fileno(), mode if wait else mode | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def quick_start_lock(path: str):
    """The open lock file of ``path``'s quick-start build if this process got it, else ``None``
    (another run is building it in place)."""
    return flock(lock_path(path), wait=False)


def quick_start_running(path: str) -> bool:
    """Whether another run holds ``path``'s quick-start lock (it is growing the cache in place)."""
    if not is_local(path) or not os.path.exists(lock_path(path)):
        return False
    held = quick_start_lock(path)
    if held is None:
        return True
    held.close()
    return False


def kv_client():
    """The ``jax.distributed`` key-value client, or None outside a distributed run."""
    from jax._src import distributed

    return distributed.global_state.client


def _key(kind: str, path: str) -> str:
    return f"meshbatch/{kind}/{path}"


def _get(key: str) -> str | None:
    """``key``'s value in the key-value store, or None (not set, or no distributed run)."""
    client = kv_client()
    if client is None:
        return None
    try:
        return client.key_value_try_get(key)
    except Exception:  # NOT_FOUND: not set (yet)
        return None


def describe(error: BaseException | str) -> str:
    """``error`` as one line: its type, message and notes."""
    if isinstance(error, str):
        return error
    return "; ".join([f"{type(error).__name__}: {error}", *getattr(error, "__notes__", ())])


def report_failure(path: str, error: BaseException) -> None:
    """Process 0: tells the processes waiting for ``path`` that its build failed, and why."""
    client = kv_client()
    if client is None:
        return
    try:
        client.key_value_set(_key("cache_build_failed", path), describe(error)[:4000])
    except Exception as why:  # e.g. already reported by an earlier attempt
        logger.warning(
            "meshbatch: could not report the failed build of %s to the other processes: %s", path, why
        )


def clear_failure(path: str) -> None:
    """Process 0, starting a build: forgets a failure reported by an earlier attempt in this run."""
    client = kv_client()
    if client is not None:
        try:
            client.key_value_delete(_key("cache_build_failed", path))
        except Exception:  # nothing to forget
            pass


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
        reported = RemoteNews(path).failure()
        if reported is None:
            return None
        return CacheBuildFailed(f"process 0 failed to build cache {path} this process waits for: {reported}")

    hint = (
        ". With several processes, cache_dir must be storage every process sees, and process 0 "
        "must not have failed (see its log)"
    )
    return poll_until(done, path=path, status=status, why=why, failure=failure, timeout=timeout, hint=hint)


def _guard(path: str, mode: int):
    """``path``'s quick-start state file beside its lock (``.<split>.quick-start.state``), ``flock``ed
    (``LOCK_EX`` to change it, ``LOCK_SH`` to read it)."""
    return flock(lock_path(path).removesuffix(".lock") + ".state", mode, opening="a+")


def _write(f, state: dict) -> None:
    f.seek(0)
    f.truncate()
    f.write(json.dumps(state))
    f.flush()


def take_lock(path: str, cache_id: str, acquire=quick_start_lock):
    """``acquire(path)`` (the build lock: ``quick_start_lock``), called with the state
    file held: when this run gets the lock, the state names ``cache_id`` before any reader can see
    the lock held."""
    with _guard(path, fcntl.LOCK_EX) as f:
        lock = acquire(path)
        if lock is not None:
            _write(f, {"cache_id": cache_id})
        return lock


def announce(path: str, cache_id: str) -> None:
    """Process 0: tells the other processes of a ``jax.distributed`` run the build they read."""
    client = kv_client()
    if client is not None:
        client.key_value_set(_key("quick_start_build", path), cache_id, allow_overwrite=True)


def release(path: str, lock, cache_id: str, error: BaseException | None) -> None:
    """The builder, ending: reports ``error`` (None: the cache is finished) to the other processes
    (``report_failure``) and runs (the state file), then lets go of the lock."""
    if error is not None:
        report_failure(path, error)
    if lock is None:
        return
    try:
        with _guard(path, fcntl.LOCK_EX) as f:
            try:
                if error is not None:
                    _write(f, {"cache_id": cache_id, "error": describe(error)[:4000]})
            finally:
                lock.close()
    except OSError as why:
        lock.close()
        logger.warning("meshbatch: could not record the end of the build of %s: %s", path, why)


class OwnNews:
    """This process's own build: its ``cache_id``, and its failure once the builder thread ends."""

    def __init__(self, cache_id: str, failed: list[BaseException]):
        self._cache_id, self._failed = cache_id, failed

    def cache_id(self) -> str | None:
        return self._cache_id

    def failure(self) -> BaseException | None:
        return self._failed[0] if self._failed else None


class RemoteNews:
    """Process 0's build, read by another process of its ``jax.distributed`` run (the key-value
    store; no news outside a distributed run)."""

    def __init__(self, path: str):
        self.path = path

    def cache_id(self) -> str | None:
        return _get(_key("quick_start_build", self.path))

    def failure(self) -> str | None:
        return _get(_key("cache_build_failed", self.path))


class LocalNews:
    """Another run's build on this machine (it holds the lock); ``accepted`` is the ``cache_id``
    this reader opened, set once it opened it."""

    STOPPED = "the run building it stopped before finishing (see its log); a new run builds it again"

    def __init__(self, path: str):
        self.path, self.accepted = path, None

    def _look(self) -> tuple[bool, dict]:
        with _guard(self.path, fcntl.LOCK_SH) as f:
            live = quick_start_running(self.path)
            f.seek(0)
            raw = f.read()
        try:
            state = json.loads(raw) if raw else {}
        except ValueError:  # written by a run killed mid-write: that run is over
            state = {}
        return live, state if isinstance(state, dict) else {}

    def cache_id(self) -> str | None:
        live, state = self._look()
        return state.get("cache_id") if live else None

    def failure(self) -> str | None:
        live, state = self._look()
        ours = self.accepted is None or state.get("cache_id") == self.accepted
        if ours and state.get("error"):
            return str(state["error"])
        if live and ours:
            return None
        ledger = try_read_ledger(self.path)
        return None if ledger is not None and ledger.is_finished else self.STOPPED
