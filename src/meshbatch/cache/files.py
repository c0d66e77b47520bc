"""Small files of a cache (ledger, checksum sidecar): atomic JSON writes and their leftovers.

write_json_atomic("/c/shard_ledger.json", {...})
  -> /c/shard_ledger.json.tmp-4242-<32 hex>   written, fsynced
  -> renamed over /c/shard_ledger.json, directory fsynced
killed before the rename: the temp file stays; remove_stale_temp_files("/c") deletes it when a
writer next opens the cache.

At an object-store URL (``gs://``, ``s3://``) the file is one object written with one PUT through
TensorStore's kvstore: a reader sees the old object or the new one, so no temp file is needed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from typing import Any

import tensorstore as ts

from .arrays import shared_context
from .stores import is_url, kvstore_spec

logger = logging.getLogger(__name__)

_TEMP_FILE = re.compile(r"^.+\.json\.tmp-(\d+)-[0-9a-f]{32}$")


def write_json_atomic(path: str, value: Any) -> None:
    """Writes ``value`` as JSON to the local file ``path`` so a crash leaves the old file or the new one.

    The JSON goes to a unique temp file (``<path>.tmp-<pid>-<random>``) that is fsynced, renamed over
    ``path``, and the directory is fsynced. A writer killed before the rename leaves the temp file;
    ``remove_stale_temp_files`` deletes it when a writer next opens the cache.
    """
    if is_url(path):
        directory, name = path.rsplit("/", 1)
        _kvstore(directory).write(name, json.dumps(value).encode()).result()
        return
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
    if is_url(directory) or not os.path.isdir(directory):
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


def remove_file(path: str) -> None:
    """Deletes ``path`` if it exists, durably (the directory is fsynced)."""
    if is_url(path):
        directory, name = path.rsplit("/", 1)
        _kvstore(directory).write(name, None).result()  # None deletes
        return
    if os.path.exists(path):
        os.unlink(path)
        _fsync_dir(os.path.dirname(path))


def directory_exists(path: str) -> bool:
    """Whether anything is stored under directory ``path`` (an object-store prefix or a local dir)."""
    if not is_url(path):
        return os.path.exists(path)
    return bool(_kvstore(path).list().result())


def _kvstore(directory: str) -> ts.KvStore:
    return ts.KvStore.open(kvstore_spec(directory), context=shared_context()).result()


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
