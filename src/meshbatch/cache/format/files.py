"""Small files of a cache (ledger, checksum sidecar): atomic JSON writes and their leftovers.

write_json_atomic("/c/shard_ledger.json", {...})
  -> /c/shard_ledger.json.tmp-4242-<32 hex>   written, fsynced
  -> renamed over /c/shard_ledger.json, directory fsynced
killed before the rename: the temp file stays; remove_stale_temp_files("/c") deletes it when a
writer next opens the cache.

TensorStore's own leftovers matter more. Its file kvstore writes key ``c/0`` by writing
``c/0.__lock`` and renaming it over ``c/0``; a writer killed before the rename leaves ``c/0.__lock``
holding part or all of a value. TensorStore (0.1.86) reuses that file for the next write of the key
without truncating it when the new value is shorter, so the rename installs the new bytes followed
by the stale tail::

    c/0.__lock  13105 bytes left by a SIGKILLed writer
    next write  12926 bytes -> c/0 = 12926 new bytes + 179 stale bytes   (size 13105)

A zarr v3 shard keeps its index (with a CRC-32C) in its last bytes, so the whole shard, every
committed row in it, then fails with ``DATA_LOSS ... Digest mismatch``. ``remove_stale_lock_files``
deletes the lock files no live writer holds before a cache writer's first write.

At an object-store URL (``gs://``, ``s3://``) the file is one object written with one PUT through
TensorStore's kvstore: a reader sees the old object or the new one, so no temp file is needed.
A ``file://`` URL is the local path it names (``stores.local_path``): the same temp files, lock
files and cleanup as a plain path.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import uuid
from typing import Any

import tensorstore as ts

from meshbatch.cache.format.stores import local_path, open_kvstore

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".__lock"  # TensorStore's file kvstore: <key>.__lock, renamed over <key> to commit
_TEMP_FILE = re.compile(r"^.+\.json\.tmp-(\d+)-[0-9a-f]{32}$")


def write_json_atomic(path: str, value: Any) -> None:
    """Writes ``value`` as JSON to the local file ``path`` so a crash leaves the old file or the new one.

    The JSON goes to a unique temp file (``<path>.tmp-<pid>-<random>``) that is fsynced, renamed over
    ``path``, and the directory is fsynced. A writer killed before the rename leaves the temp file;
    ``remove_stale_temp_files`` deletes it when a writer next opens the cache.
    """
    local = local_path(path)
    if local is None:
        directory, name = path.rsplit("/", 1)
        open_kvstore(directory).write(name, json.dumps(value).encode()).result()
        return
    path = local
    root = os.path.dirname(path)
    os.makedirs(root, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
    try:
        with open(tmp, "w") as f:
            json.dump(value, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(root)


def remove_stale_temp_files(directory: str) -> list[str]:
    """Deletes the temp files of ``write_json_atomic`` left in ``directory`` by killed writers.

    A temp file whose process is still alive on this host (and is not this process) is kept: it may
    be another writer mid-commit. Returns the names removed.
    """
    directory = local_path(directory)
    if directory is None or not os.path.isdir(directory):
        return []  # object stores get no temp files
    removed = []
    for name in os.listdir(directory):
        match = _TEMP_FILE.match(name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and _process_alive(pid):
            logger.warning("keeping %s: process %d that writes it is alive", name, pid)
            continue
        os.unlink(os.path.join(directory, name))
        removed.append(name)
    if removed:
        logger.info("removed stale temp files %s from %s", removed, directory)
    return removed


def remove_stale_lock_files(directory: str) -> list[str]:
    """Deletes TensorStore ``*.__lock`` files under ``directory`` that no live writer holds.

    A lock file is stale when its byte-range lock can be taken without waiting (a writer holds it
    only while it writes, and the lock dies with its process). Deleting it while holding its lock,
    after checking it is still the file at that path, is what TensorStore's own locking rule allows.
    Returns the paths removed (relative to ``directory``). Object stores have no lock files.
    """
    directory = local_path(directory)
    if directory is None:
        return []
    removed = []
    for parent, _, names in os.walk(directory):
        for name in names:
            if name.endswith(LOCK_SUFFIX) and _remove_unheld_lock(os.path.join(parent, name)):
                removed.append(os.path.relpath(os.path.join(parent, name), directory))
    if removed:
        logger.info("removed stale TensorStore lock files %s from %s", removed, directory)
    return removed


def _remove_unheld_lock(path: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # conflicts with TensorStore's OFD locks
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            logger.warning("keeping %s: a live writer holds it", path)
            return False
        try:
            if os.stat(path).st_ino != os.fstat(fd).st_ino:
                return False  # renamed or replaced since we opened it: not ours to delete
        except FileNotFoundError:
            return False
        os.unlink(path)
        _fsync_dir(os.path.dirname(path))
        return True
    finally:
        os.close(fd)


def remove_file(path: str) -> None:
    """Deletes ``path`` if it exists, durably (the directory is fsynced)."""
    local = local_path(path)
    if local is None:
        directory, name = path.rsplit("/", 1)
        open_kvstore(directory).write(name, None).result()  # None deletes
        return
    path = local
    if os.path.exists(path):
        os.unlink(path)
        _fsync_dir(os.path.dirname(path))


def file_exists(path: str) -> bool:
    """Whether the file ``path`` exists: a local file, or one object at an object-store URL."""
    local = local_path(path)
    if local is not None:
        return os.path.isfile(local)
    directory, name = path.rsplit("/", 1)
    return open_kvstore(directory).read(name).result().state == "value"


def remove_directory(path: str) -> None:
    """Deletes directory ``path`` and all it holds: a local tree, or every object under a URL's
    prefix (one TensorStore ``delete_range``; ``gs://b/x`` deletes ``x/...``, never ``xy/...``)."""
    local = local_path(path)
    if local is not None:
        shutil.rmtree(local)
        return
    open_kvstore(path).delete_range(ts.KvStore.KeyRange()).result()


def directory_exists(path: str) -> bool:
    """Whether anything is stored under directory ``path`` (an object-store prefix or a local dir)."""
    local = local_path(path)
    if local is not None:
        return os.path.exists(local)
    return bool(open_kvstore(path).list().result())


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
