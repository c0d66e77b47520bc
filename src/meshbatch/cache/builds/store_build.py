"""One build of a cache at an object-store URL (``gs://``, ``s3://``) among independent runs.

There is no atomic rename on an object store, so the build writes in place, and two runs (two jobs
asking for the same missing cache) are kept apart by the build lock beside it
(``meshbatch.cache.builds.store_lock``: TensorStore's conditional writes, a lease renewed while building)::

    build_in_place("s3://b/c/train", build)
    # a finished cache there       -> False (nothing built)
    # the lock free, or expired    -> take it; look for a finished cache again; delete the leftover
    #                                 of a dead build (only cache objects, else FileExistsError);
    #                                 build(path) while the lock is renewed; delete the lock -> True
    # another run's live lock      -> wait for its finished ledger (wait_for_finished, in slices of
    #                                 half its lease), reading the lock between slices: finished ->
    #                                 False; lock deleted unfinished (its build failed) or expired
    #                                 (not renewed for a lease: killed) -> take it, as above
    # MESHBATCH_CACHE_WAIT_S spent  -> CacheWaitTimeout naming the lock's holder

``MESHBATCH_BUILD_LOCK=off`` builds in place without the lock (a store that ignores conditional
writes, where the lock raises ``ConditionalWritesUnsupported``; two runs racing can tear the cache).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import tensorstore as ts

from meshbatch.cache.builds.build_news import wait_for_finished
from meshbatch.cache.builds.store_lock import StoreLock
from meshbatch.cache.builds.waiting import CacheWaitTimeout, wait_seconds
from meshbatch.cache.format.ledger import LEDGER_FILE_NAME, try_read_ledger
from meshbatch.cache.format.stores import kvstore_spec, shared_context
from meshbatch.cache.integrity.checksums import SIDECAR_FILE_NAME

logger = logging.getLogger(__name__)
LOCK_ENV = "MESHBATCH_BUILD_LOCK"


class BuildLockLost(RuntimeError):
    """This run's build lock was taken over while it built (it was not renewed for a lease)."""


def build_in_place(path: str, build: Callable[[str], object]) -> bool:
    """Runs ``build(path)`` unless another run's build of ``path`` finishes first (module
    docstring). Returns whether this run built it."""
    setting = os.environ.get(LOCK_ENV, "on")
    if setting not in ("on", "off"):
        raise ValueError(f"{LOCK_ENV} must be 'on' or 'off' (got {LOCK_ENV}={setting!r})")
    if setting == "off":
        logger.warning("meshbatch: %s=off: building %s in place without a lock", LOCK_ENV, path)
        build(path)
        return True
    lock, timeout = StoreLock(path), wait_seconds()
    start = time.monotonic()
    state = "free"
    for _ in range(1_000_000):  # bounded by the deadline below; each round waits, or takes the lock
        if _finished(path):
            return False
        if state != "live":
            if lock.take():
                return _build_holding(lock, path, build)
            state = "live"
            continue
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            break
        logger.info("meshbatch: cache %s is being built by another run (%s); waiting", path, lock.holder)
        try:
            wait_for_finished(
                path, timeout=min(left, lock.watch_interval()), why=f"another run builds it: {lock.holder}"
            )
            return False
        except CacheWaitTimeout:
            state = lock.poll()
    raise CacheWaitTimeout(
        f"cache {path} is not finished after waiting {time.monotonic() - start:.0f} s for the run "
        f"holding its build lock {lock.url} ({lock.holder}); the bound is MESHBATCH_CACHE_WAIT_S={timeout:g}"
    )


def _finished(path: str) -> bool:
    found = try_read_ledger(path)
    return found is not None and found.is_finished


def _build_holding(lock: StoreLock, path: str, build: Callable[[str], object]) -> bool:
    try:
        if _finished(path):  # published by the run whose lock we just replaced or saw go
            return False
        _remove_leftover(path)
        with lock.renewing():
            build(path)
        if lock.lost is not None:
            raise BuildLockLost(
                f"the build lock of {path} was taken over while this run built it ({lock.lost}); "
                "the cache may mix both builds' writes: once the other run is done, delete "
                f"{path} and build it again (raise MESHBATCH_BUILD_LEASE_S if the store is slow)"
            )
        return True
    finally:
        lock.release()


def _remove_leftover(path: str) -> None:
    """Deletes an unfinished cache at ``path`` (a dead build's: its ledger, sidecars and field
    arrays only); anything else there is refused by name, never deleted."""
    kv = ts.KvStore.open(kvstore_spec(path), context=shared_context()).result()
    keys = [k.decode() for k in kv.list().result()]
    if not keys:
        return
    odd = [k for k in keys if not _cache_object(k)]
    if odd:
        raise FileExistsError(
            f"cannot build the cache at {path}: it holds objects that are not a cache's "
            f"({sorted(odd)[:5]}); move them away or choose another cache_dir"
        )
    logger.warning("meshbatch: deleting %d objects of a dead run's unfinished build at %s", len(keys), path)
    kv.delete_range(ts.KvStore.KeyRange()).result()


def _cache_object(key: str) -> bool:
    parts = key.split("/")
    if len(parts) == 1:
        return key in (LEDGER_FILE_NAME, SIDECAR_FILE_NAME)
    if len(parts) == 2:
        return parts[1] == SIDECAR_FILE_NAME
    return parts[1] in ("offsets", "data")
