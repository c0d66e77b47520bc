"""What a quick-start build tells the processes and runs that read it: which build it is (the
``cache_id`` its ledgers carry) and how it ended. A reader opens only that build's rows (never a
killed build's leftover at the path, which the builder is about to delete) and raises the
builder's error as soon as it is reported.

* in a ``jax.distributed`` run process 0 sets ``meshbatch/quick_start_build/<path>`` in the
  key-value store to its build's ``cache_id`` before the builder starts, and reports a failure,
  or a stop, with ``build_once.report_failure`` (the others raise ``CacheBuildFailed``);
* on a local path the run holding the build lock (``build_once.quick_start_lock``) writes
  ``{"cache_id": ...}`` to ``.<split>.quick-start.state`` beside it, and adds ``"error"`` when it
  ends unfinished. The state file's own ``flock`` keeps the pair (lock held, state) consistent: a
  run takes the build lock and writes the state holding it exclusively, a reader looks at both
  holding it shared, so it never pairs a new build's lock with a killed build's state.

    lock = take_lock("cache/owt/train", "3f9c...")  # None: another run builds it
    news = LocalNews("cache/owt/train")              # in that other run
    news.cache_id()   # "3f9c..." (while the lock is held); the reader waits for its ledger
    release("cache/owt/train", lock, "3f9c...", QuickStartBuildError("the build was stopped ..."))
    news.failure()    # "QuickStartBuildError: the build was stopped ..."
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os

from meshbatch.cache.builds.build_once import lock_path, quick_start_lock, quick_start_running
from meshbatch.cache.builds.build_status import kv_client, report_failure, reported_failure
from meshbatch.cache.format.ledger import try_read_ledger

logger = logging.getLogger(__name__)


def describe(error: BaseException | str) -> str:
    """``error`` as one line: its type, message and notes."""
    if isinstance(error, str):
        return error
    return "; ".join([f"{type(error).__name__}: {error}", *getattr(error, "__notes__", ())])


def state_path(path: str) -> str:
    """``path``'s quick-start state file, beside its lock: ``.<split>.quick-start.state``."""
    return lock_path(path).removesuffix(".lock") + ".state"


@contextlib.contextmanager
def _guard(path: str, mode: int):
    """The state file, ``flock``ed (``LOCK_EX`` to change it, ``LOCK_SH`` to read it)."""
    state = state_path(path)
    os.makedirs(os.path.dirname(state), exist_ok=True)
    with open(state, "a+") as f:
        fcntl.flock(f.fileno(), mode)
        yield f


def _write(f, state: dict) -> None:
    f.seek(0)
    f.truncate()
    f.write(json.dumps(state))
    f.flush()


def take_lock(path: str, cache_id: str, acquire=quick_start_lock):
    """``acquire(path)`` (the build lock: ``build_once.quick_start_lock``), called with the state
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
        client.key_value_set(_key(path), cache_id, allow_overwrite=True)


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


def _key(path: str) -> str:
    return f"meshbatch/quick_start_build/{path}"


class OwnNews:
    """This process's own build: its ``cache_id``, and its failure once the builder thread ends."""

    def __init__(self, cache_id: str, failed: list[BaseException]):
        self._cache_id, self._failed = cache_id, failed

    def cache_id(self) -> str | None:
        return self._cache_id

    def failure(self) -> BaseException | None:
        return self._failed[0] if self._failed else None


class RemoteNews:
    """Process 0's build, read by another process of its ``jax.distributed`` run."""

    def __init__(self, path: str):
        self.path = path

    def cache_id(self) -> str | None:
        try:
            return kv_client().key_value_try_get(_key(self.path))
        except Exception:  # NOT_FOUND: not announced yet
            return None

    def failure(self) -> str | None:
        return reported_failure(self.path)


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
