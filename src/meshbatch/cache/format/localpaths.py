"""A cache on the local disk: ``file://`` URLs are the path they name, and no directory inside a
cache leaves it.

``file:///data/c`` and ``/data/c`` are one cache: TensorStore's ``file`` kvstore serves both, so
everything meshbatch does to local files (stale lock and temp file cleanup, fsynced JSON writes,
the ledger's ``stat`` stamp) goes to ``local_path(path)`` for either spelling::

    local_path("/data/c")          -> "/data/c"
    local_path("file:///data/c")   -> "/data/c"
    local_path("gs://b/c")         -> None        (an object store: no symlinks, no local files)

**Symlinks.** The cache root may be a symlink (a whole cache kept on another disk). The directories
meshbatch opens *inside* it, a shard's directory and a field's directory with its ``data`` and
``offsets``, must resolve (``os.path.realpath``) strictly below the resolved root, for writes and
for reads alike; otherwise a ``CacheIntegrityError`` names the path and where it leads::

    /c -> /disk2/c                          allowed: the root itself
    /c/part-1 -> ../outside                 refused: /outside is not below /disk2/c
    /c/input_ids -> /c                      refused: the field would alias the root
    /c/sub -> /c/sub2  (shard "sub/p")      allowed: it stays inside

A writer checks before it deletes or writes anything (a symlinked field directory was emptied by
``if_exists="overwrite"``, a symlinked shard directory written into); a reader before it reads any
array of the part (it would serve another cache's tokens as this one's). The check runs when a
directory is opened: it does not guard against a symlink swapped in while a writer runs.
Files (the ledger, the sidecar) are never written through: they are replaced by ``rename``.
"""

from __future__ import annotations

import os
import posixpath

from meshbatch.cache.format.checks import CacheIntegrityError
from meshbatch.cache.format.stores import is_url

FILE_SCHEME = "file://"


def local_path(path: str) -> str | None:
    """The local filesystem path of ``path`` (a plain path or a ``file://`` URL), else None."""
    if path.startswith(FILE_SCHEME):
        return path[len(FILE_SCHEME) :]
    return None if is_url(path) else path


def check_inside(root: str, path: str, *, what: str) -> None:
    """Refuses a local ``path`` inside ``root`` that resolves outside it (or onto it).

    Args:
        root: the cache root (plain path or URL; a non-local root is not checked).
        path: a directory under ``root`` (``root`` joined with relative names).
        what: what ``path`` is, for the message (``"shard 'part-1'"``, ``"field 'input_ids'"``).

    Raises:
        CacheIntegrityError: naming ``path``, where it resolves, and the root.
    """
    local_root, local = local_path(root), local_path(path)
    if local_root is None or local is None:
        return
    real_root, real = os.path.realpath(local_root), os.path.realpath(local)
    if not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise CacheIntegrityError(
            f"{what} at {path} resolves to {real}, not inside the cache root {root} (resolved: "
            f"{real_root}): a symlink inside a cache must not lead out of it"
        )


def check_field_inside(root: str, field: str) -> None:
    """``check_inside`` for the field directory ``<root>/<field>`` and its ``data`` and ``offsets``."""
    field_root = posixpath.join(root, field)
    check_inside(root, field_root, what=f"field {field!r}")
    for name in ("offsets", "data"):
        check_inside(root, posixpath.join(field_root, name), what=f"field {field!r} array {name!r}")
