"""Where a cache lives: a local directory or an object-store URL, as a TensorStore kvstore, opened
in the one process-wide context (``shared_context``: cache pool, bounded retries, concurrency).

Every byte of a cache (arrays, ledger, checksum sidecar) goes through TensorStore's own kvstore
drivers, so a cache at ``gs://bucket/path`` or ``s3://bucket/path`` is read and written exactly like
a local one::

    kvstore_spec("/data/c")          -> {"driver": "file", "path": "/data/c/"}
    kvstore_spec("gs://b/c")         -> {"driver": "gcs", "bucket": "b", "path": "c/"}
    kvstore_spec("s3://b/c")         -> {"driver": "s3", "bucket": "b", "path": "c/"}
                                        (+ "endpoint"/"aws_region" from the environment, below)

Pointing at a server other than the cloud's (a local emulator, MinIO, a proxy):

- GCS: TensorStore reads ``TENSORSTORE_GCS_HTTP_URL`` (``http://127.0.0.1:4443``).
- S3: ``MESHBATCH_S3_ENDPOINT`` (else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``) becomes
  the kvstore's ``endpoint``; ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` its ``aws_region``.

A store that stops answering is retried by TensorStore with exponential backoff (the
``gcs_request_retries`` / ``s3_request_retries`` context resources, bounded: see
``store_context``), and every read meshbatch waits on has a deadline; past either, the read
raises ``StoreUnavailableError`` (never zeros, never a hang).

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
import threading
from typing import Any

import tensorstore as ts

from meshbatch.cache.format.checks import CacheIntegrityError

OBJECT_SCHEMES = ("gs", "s3")
DEFAULT_RETRIES = 6  # attempts after the first; backoff 0.1 s doubling to 2 s: about 6 s in all
DEFAULT_READ_TIMEOUT_S = 120.0  # the longest meshbatch waits on one batch of reads
DEFAULT_CACHE_POOL_BYTES = 1 << 30  # as Levanter's CACHE_BYTES_LIMIT default
FILE_SCHEME = "file://"


class StoreUnavailableError(OSError):
    """The store holding a cache did not answer (server gone, 5xx, timeouts) within its retries
    and deadline. Nothing was returned for the read: no token of a failed read is ever served."""


def is_url(path: str) -> bool:
    return "://" in path


def local_path(path: str) -> str | None:
    """The local filesystem path of ``path`` (a plain path or a ``file://`` URL), else None."""
    if path.startswith(FILE_SCHEME):
        return path[len(FILE_SCHEME) :]
    return None if is_url(path) else path


def split_url(path: str) -> tuple[str, str, str]:
    """``"gs://bucket/a/b"`` -> ``("gs", "bucket", "a/b")``.

    Raises:
        ValueError: no bucket in the URL.
    """
    scheme, rest = path.split("://", 1)
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"object-store URL needs a bucket: {scheme}://BUCKET/PATH (got path={path!r})")
    return scheme, bucket, key.strip("/")


def kvstore_spec(path: str) -> str | dict[str, Any]:
    """The TensorStore kvstore of directory ``path``: local, ``gs://``, ``s3://`` or any TensorStore URL."""
    if not is_url(path):
        return {"driver": "file", "path": os.path.abspath(path) + "/"}
    scheme = path.split("://", 1)[0]
    if scheme not in OBJECT_SCHEMES:
        return path.rstrip("/") + "/"
    scheme, bucket, key = split_url(path)
    spec: dict[str, Any] = {"driver": "gcs" if scheme == "gs" else "s3", "bucket": bucket}
    spec["path"] = key + "/" if key else ""
    if scheme == "s3":
        endpoint = _first_env("MESHBATCH_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        if endpoint:
            spec["endpoint"] = endpoint
        region = _first_env("AWS_REGION", "AWS_DEFAULT_REGION")
        if region:
            spec["aws_region"] = region
    return spec


def store_context_spec(
    *,
    cache_bytes: int,
    retries: int | None = None,
    initial_delay_s: float = 0.1,
    max_delay_s: float = 2.0,
    request_concurrency: int | None = None,
    copy_concurrency: int | None = None,
) -> dict[str, Any]:
    """The JSON of a TensorStore context: cache pool, bounded retries, request concurrency.

    ``retries`` defaults to ``MESHBATCH_STORE_RETRIES`` (else 6): with backoff from
    ``initial_delay_s`` doubling to ``max_delay_s``, a store that is gone fails a read after about
    ``sum(min(initial * 2**i, max) for i < retries)`` seconds plus the requests' own time.
    """
    if retries is None:
        retries = int(os.environ.get("MESHBATCH_STORE_RETRIES", DEFAULT_RETRIES))
    if retries < 0:
        raise ValueError(f"retries must be >= 0 (got retries={retries})")
    backoff = {
        "max_retries": retries,
        "initial_delay": f"{initial_delay_s}s",
        "max_delay": f"{max_delay_s}s",
    }
    spec: dict[str, Any] = {
        "cache_pool": {"total_bytes_limit": int(cache_bytes)},
        "gcs_request_retries": backoff,
        "s3_request_retries": backoff,
    }
    if request_concurrency is not None:
        spec["gcs_request_concurrency"] = {"limit": int(request_concurrency)}
        spec["s3_request_concurrency"] = {"limit": int(request_concurrency)}
    if copy_concurrency is not None:
        spec["data_copy_concurrency"] = {"limit": int(copy_concurrency)}
    return spec


_context_lock = threading.Lock()
_shared_context: ts.Context | None = None


def shared_context() -> ts.Context:
    """The process-wide TensorStore context (cache pool + I/O concurrency) every cache open uses.

    Its cache pool holds ``MESHBATCH_TS_CACHE_BYTES`` bytes (default 1 GiB) of decoded chunks;
    object-store requests are retried a bounded number of times (``store_context_spec``).
    """
    global _shared_context
    with _context_lock:
        if _shared_context is None:
            limit = int(os.environ.get("MESHBATCH_TS_CACHE_BYTES", DEFAULT_CACHE_POOL_BYTES))
            _shared_context = ts.Context(store_context_spec(cache_bytes=limit))
        return _shared_context


def uncached(context: ts.Context) -> ts.Context:
    """``context`` with a cache pool of its own that keeps nothing: reads through it decode their
    chunks and drop them (the other resources, request concurrency included, are ``context``'s)."""
    return ts.Context({"cache_pool": {"total_bytes_limit": 0}}, context)


def open_kvstore(directory: str, *, context: ts.Context | None = None) -> ts.KvStore:
    """The kvstore of ``directory`` (``kvstore_spec``), opened in ``context`` (``shared_context()``)."""
    return ts.KvStore.open(kvstore_spec(directory), context=context or shared_context()).result()


def sized_context_spec(
    *, read_latency_s: float, step_s: float, requests_per_step: float, bytes_per_step: int, depth: int
) -> dict[str, Any]:
    """A context sized from measured latency (``Pipeline.stats()``), by Little's law.

    Requests in flight = requests per second x latency; the limit is twice that (a tail), at least
    32 (TensorStore's default) and at most 1024. The cache pool holds every step in the making
    twice over, at least 256 MiB. Retries back off up to ten latencies (at least 2 s)::

        100 ms latency, 40 requests per 0.25 s step, 4 MiB a step, depth 4
        -> request concurrency 2 * 40 / 0.25 * 0.1 = 32, cache pool 256 MiB, max_delay 2 s
    """
    for name, value in (("read_latency_s", read_latency_s), ("step_s", step_s)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 (got {name}={value})")
    in_flight = requests_per_step / step_s * read_latency_s
    concurrency = min(max(int(2 * in_flight + 0.999), 32), 1024)
    pool = max(2 * depth * int(bytes_per_step), 256 << 20)
    return store_context_spec(
        cache_bytes=pool,
        request_concurrency=concurrency,
        max_delay_s=max(2.0, 10 * read_latency_s),
        copy_concurrency=os.cpu_count() or 1,
    )


def context_spec_from_stats(stats: dict[str, float], *, batch_size: int) -> dict[str, Any]:
    """``sized_context_spec`` from what a stream measured (``Pipeline.stats()`` after a warm-up):
    its read latency (``read_p99_s``: one batch of a step's reads, issued together, so about one
    request's latency with its tail), consumer step (``step_p50_s``), requests and bytes per
    example times ``batch_size``, and prefetch ``depth``. TensorStore sizes a context when a cache
    is opened, so the result is for the next open (``TokenCache.open(path, context=ts.Context(spec))``)::

        read_p99_s 0.12, step_p50_s 0.3, requests_per_example 0.0076, bytes_per_example 7900,
        depth 8, batch_size 256 -> 1.9 requests a step: concurrency 32 (the floor), pool 256 MiB

    Raises:
        ValueError: ``stats`` lacks a measurement (no stream, or fewer than two steps taken).
    """
    keys = ("read_p99_s", "step_p50_s", "requests_per_example", "bytes_per_example", "depth")
    missing = [k for k in keys if k not in stats]
    if missing or not stats["step_p50_s"] > 0 or not stats["read_p99_s"] > 0:
        raise ValueError(
            f"stats do not measure a stream yet (missing {missing}, step_p50_s="
            f"{stats.get('step_p50_s')}, read_p99_s={stats.get('read_p99_s')}): take a few steps first"
        )
    return sized_context_spec(
        read_latency_s=stats["read_p99_s"],
        step_s=stats["step_p50_s"],
        requests_per_step=stats["requests_per_example"] * batch_size,
        bytes_per_step=int(stats["bytes_per_example"] * batch_size),
        depth=int(stats["depth"]),
    )


def read_timeout_s() -> float:
    """Seconds meshbatch waits on one batch of reads: ``MESHBATCH_READ_TIMEOUT_S`` (default 120)."""
    return float(os.environ.get("MESHBATCH_READ_TIMEOUT_S", DEFAULT_READ_TIMEOUT_S))


def is_unavailable(error: BaseException) -> bool:
    """Whether a TensorStore error says the store did not answer (rather than bad data)."""
    text = str(error)
    return any(code in text for code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "RESOURCE_EXHAUSTED"))


def result(future: ts.Future, *, what: str):
    """``future.result()`` within ``read_timeout_s()``; a store that does not answer (timeout, or
    an error TensorStore gives after its retries) is a ``StoreUnavailableError`` naming ``what``."""
    timeout = read_timeout_s()
    try:
        return future.result(timeout=timeout)
    except TimeoutError as e:
        future.cancel()
        raise StoreUnavailableError(f"{what}: no answer from the store within {timeout}s") from e
    except ValueError as e:
        if is_unavailable(e):
            raise StoreUnavailableError(f"{what}: the store did not answer: {e}") from e
        raise


def _first_env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def check_inside(root: str, path: str, *, what: str) -> None:
    """Refuses a local ``path`` inside ``root`` (``root`` joined with relative names) that resolves
    outside it (or onto it): a ``CacheIntegrityError`` naming ``what`` (``"shard 'part-1'"``),
    ``path``, where it resolves, and the root. A URL is not checked (an object store has no symlinks).
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
