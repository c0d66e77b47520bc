"""One build per cache among independent runs (a ``jax.distributed`` run's process 0 is one of
them: ``builds_here``; its other processes ``wait_for_finished``).

On a local path a build writes a hidden sibling ``.<split>.building-<id>`` and renames it into
place when it is finished, so an independent run never sees half a cache. Two runs racing both
build; the first rename wins and the loser deletes its copy and uses the winner's. A build holds
a lock beside its copy while it lives; the next build removes the copies of killed ones. An unfinished
leftover at the path (a cache whose ledger is unfinished, or a build killed before its ledger:
only field directories of ``offsets``/``data`` arrays) is moved aside and deleted, unless a
quick-start build holds the path's lock (``quick_start_lock``): then it is waited for. Anything
else there (not a cache) is refused by name, never deleted.
On an object store (``gs://``, ``s3://``) the build writes in place (no atomic rename there),
one run at a time: ``store_build.build_in_place`` (a lease lock object beside the cache).

    build_once("cache/owt/train", lambda target: write_cache(target))
    # process 0, or a lone run: writes cache/owt/.train.building-3f9c..., renames it to
    # cache/owt/train; returns True (ours), or False (another run's finished cache was there first)
    wait_for_finished("cache/owt/train")   # every other process: returns the finished ledger
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import uuid
from collections.abc import Callable

from meshbatch.cache.builds.build_news import flock, is_local, quick_start_running, wait_for_finished
from meshbatch.cache.builds.store_build import build_in_place
from meshbatch.cache.format.ledger import LEDGER_FILE_NAME, try_read_ledger
from meshbatch.cache.integrity.checksums import SIDECAR_FILE_NAME

logger = logging.getLogger(__name__)


def build_once(path: str, build: Callable[[str], object]) -> bool:
    """Runs ``build(target)`` (it writes a finished cache at ``target``) and makes the result the
    cache at ``path`` (see the module docstring). Returns whether this build's copy is the one at
    ``path`` (False: another run's finished cache got there first and this copy was deleted)."""
    if not is_local(path):
        return build_in_place(path, build)
    path = os.path.abspath(path.removeprefix("file://"))
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    _remove_dead_builds(parent, name)
    tmp = os.path.join(parent, f".{name}.building-{uuid.uuid4().hex[:12]}")
    alive = flock(f"{tmp}.lock", opening="w")  # held while this build lives (the process's death frees it)
    try:
        build(tmp)
        return _publish(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # still there only when another copy won
        with contextlib.suppress(FileNotFoundError):  # removed as dead just before our flock
            os.remove(f"{tmp}.lock")
        alive.close()


def _remove_dead_builds(parent: str, name: str) -> None:
    """Deletes the hidden copies of builds of ``name`` that were killed (their lock is free): a
    pre-empted build leaves its whole copy behind, and nothing else would ever remove it."""
    prefix = f".{name}.building-"
    for entry in os.listdir(parent):
        if not (entry.startswith(prefix) and entry.endswith(".lock")):
            continue
        lock = os.path.join(parent, entry)
        try:
            f = flock(lock, wait=False, opening="r")
        except FileNotFoundError:  # its build just finished
            continue
        if f is None:  # a live build
            continue
        with f:
            copy = lock.removesuffix(".lock")
            logger.warning("meshbatch: removing %s, the copy of a build that was killed", copy)
            shutil.rmtree(copy, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(lock)


def _cache_layout(path: str) -> bool:
    """Whether ``path`` holds only what a cache build writes (a build killed before its ledger):
    field directories of ``offsets``/``data`` arrays, the ledger and the checksum sidecar."""
    if not os.path.isdir(path):
        return False
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            if not set(os.listdir(entry.path)) <= {"offsets", "data"}:
                return False
        elif entry.name not in (LEDGER_FILE_NAME, SIDECAR_FILE_NAME):
            return False
    return True


def _publish(tmp: str, path: str) -> bool:
    parent, name = os.path.split(path)
    for _ in range(8):  # each round either publishes, finds a finished cache, or clears a leftover
        try:
            os.rename(tmp, path)
            return True
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        found = try_read_ledger(path)
        if found is not None and found.is_finished:
            logger.info(
                "meshbatch: cache %s was finished by another run first; using it, dropping ours", path
            )
            return False
        if quick_start_running(path):
            wait_for_finished(path, why="another run's quick start is building it in place")
            return False
        if found is None and not _cache_layout(path):  # not a cache: never delete it
            entries = sorted(os.listdir(path))[:5] if os.path.isdir(path) else "a file"
            raise FileExistsError(
                f"cannot build the cache at {path}: it exists and is not a cache (no shard_ledger.json; "
                f"it holds {entries}); move it away or choose another cache_dir"
            )
        aside = os.path.join(parent, f".{name}.stale-{uuid.uuid4().hex[:12]}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            continue
        moved = try_read_ledger(aside)
        if moved is not None and moved.is_finished:  # another run published between our two reads
            try:
                os.rename(aside, path)
                return False
            except OSError:  # a third copy is in place now: keep this finished one (a reader may use it)
                logger.warning("meshbatch: left a finished copy of cache %s at %s (delete it)", path, aside)
                continue
        logger.warning("meshbatch: replaced an unfinished leftover cache at %s (a killed build)", path)
        shutil.rmtree(aside, ignore_errors=True)
    raise RuntimeError(f"could not move the finished cache {tmp} to {path}: it kept being replaced")
