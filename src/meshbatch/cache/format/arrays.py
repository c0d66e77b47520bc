"""The TensorStore arrays of one cache field, exactly as Levanter lays them out.

A field (``input_ids``) is a jagged array stored as two zarr v3 arrays::

    <root>/input_ids/offsets   int64, offsets[0] = row count, row i = data[offsets[i] : offsets[i+1]]
                               (row 0 starts at 0: offsets[0] is the count, not a start)
    <root>/input_ids/data      the tokens of all rows back to back, any integer dtype

    rows [5,6,7], [8], [9,9] -> offsets = [3, 3, 4, 6, 0, ...], data = [5, 6, 7, 8, 9, 9, 0, ...]

Both arrays have shape ``2**54`` (unbounded in practice), a ``2**27``-element write chunk holding
``2**18``-element (``DEFAULT_CHUNK_SIZE``) blosc-compressed inner chunks via ``sharding_indexed``:
Levanter's ``jagged_array._get_spec``. All opens share one ``ts.Context`` (``stores.shared_context``).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import posixpath
from dataclasses import dataclass

import numpy as np
import tensorstore as ts

from meshbatch.cache.format.checks import CacheIntegrityError
from meshbatch.cache.format.stores import check_field_inside, kvstore_spec, shared_context

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 256 * 1024  # tokens per inner (read) chunk; Levanter's DEFAULT_CHUNK_SIZE
DEFAULT_WRITE_CHUNK_SIZE = DEFAULT_CHUNK_SIZE * 512  # tokens per stored shard file
ARRAY_SHAPE = 2**54  # Levanter's "unbounded" extent; the row count lives in offsets[0]


_OPENINGS = itertools.count(1)


@dataclass(frozen=True)
class FieldArrays:
    """The open ``offsets`` and ``data`` arrays of one field of one consolidated cache directory.

    ``opened`` numbers this opening (unique in the process): a ``BlockCache`` keys blocks by it, so
    arrays opened again at the same path (a new reader of a cache replaced since) never get blocks
    an earlier opening read.
    """

    root: str
    offsets: ts.TensorStore
    data: ts.TensorStore
    opened: int = dataclasses.field(default_factory=lambda: next(_OPENINGS))

    @property
    def data_path(self) -> str:
        return posixpath.join(self.root, "data")


def open_field(
    root: str,
    field: str,
    *,
    writable: bool = False,
    context: ts.Context | None = None,
    offsets_context: ts.Context | None = None,
) -> FieldArrays:
    """Opens the existing ``<root>/<field>/{offsets,data}``; read-only unless ``writable``.

    ``offsets_context`` opens the offsets array in another context than the data (``uncached``:
    a lazily opened cache reads a few offsets at a time, and keeps none of their chunks decoded).

    Reads never fill in missing chunks: a chunk that is not stored fails the read
    (``fill_missing_data_reads: false``) instead of reading as zeros.

    Raises:
        FileNotFoundError: either array has no ``zarr.json``.
        CacheIntegrityError: an array is not what Levanter writes: offsets not int64, data not
            integers, not 1-D of shape ``[2**54]``, or metadata TensorStore cannot parse; or the field
            directory (or its ``data``/``offsets``) is a symlink out of ``root`` (``stores.check_inside``).
    """
    check_field_inside(root, field)
    field_root = posixpath.join(root, field)
    context = context or shared_context()
    mode = {"open": True, "read": True, "write": writable}
    contexts = {"offsets": offsets_context or context, "data": context}
    futures = {
        name: ts.open(_spec(posixpath.join(field_root, name), writable), context=contexts[name], **mode)
        for name in ("offsets", "data")
    }
    stores = {name: _result(future, posixpath.join(field_root, name)) for name, future in futures.items()}
    offsets, data = stores["offsets"], stores["data"]
    for name, store in stores.items():
        where = posixpath.join(field_root, name)
        dtype = np.dtype(store.dtype.numpy_dtype)
        if name == "offsets" and dtype != np.int64:
            raise CacheIntegrityError(f"{where} has dtype {dtype}; Levanter caches use int64")
        if name == "data" and not np.issubdtype(dtype, np.integer):
            raise CacheIntegrityError(f"{where} has dtype {dtype}; token data must be integers")
        if list(store.domain.shape) != [ARRAY_SHAPE]:
            raise CacheIntegrityError(
                f"{where} has shape {list(store.domain.shape)}; Levanter writes [{ARRAY_SHAPE}]"
            )
    return FieldArrays(field_root, offsets, data)


def create_field(root: str, field: str, dtype: np.dtype) -> FieldArrays:
    """Creates empty writable field arrays in Levanter's layout, deleting any existing ones.

    Raises:
        CacheIntegrityError: before anything is deleted, when the field directory (or its
            ``data``/``offsets``) is a symlink out of ``root``: the delete would follow it.
    """
    check_field_inside(root, field)
    field_root = posixpath.join(root, field)
    futures = {}
    for name in ("offsets", "data"):
        spec = _spec(posixpath.join(field_root, name), True)
        spec["metadata"] = _levanter_metadata(np.dtype(np.int64 if name == "offsets" else dtype))
        futures[name] = (spec, ts.open(spec, context=shared_context(), create=True, delete_existing=True))
    stores = {
        name: created(spec, future, posixpath.join(field_root, name))
        for name, (spec, future) in futures.items()
    }
    return FieldArrays(field_root, stores["offsets"], stores["data"])


CREATE_ATTEMPTS = 3  # opens of one array with create + delete_existing, while each fails ALREADY_EXISTS


def created(spec: dict, future: ts.Future | None = None, path: str | None = None) -> ts.TensorStore:
    """The array ``spec`` describes, created new (``create=True, delete_existing=True``), from
    ``future`` (that open, already started) or a fresh open.

    Such an open writes ``zarr.json`` *only if absent* after deleting the old array. On an object
    store a lost reply to that write (the store applied it; the client timed out or lost the
    connection) is retried by TensorStore and refused as ``ALREADY_EXISTS``, by its own first
    attempt (google/tensorstore#290; ``tests/cache/test_cache_store_builds.py`` loses the reply on
    purpose). The open deletes whatever is there anyway, so on ``gs://`` and ``s3://`` it is tried
    again, ``CREATE_ATTEMPTS`` times in all, each retry logged. A local file system has no lost
    replies: there ``ALREADY_EXISTS`` means another writer, and is raised at once.

    Raises:
        CacheIntegrityError: any other failure, or ``ALREADY_EXISTS`` on every attempt.
    """
    kv = spec["kvstore"]  # ``kvstore_spec``: a dict, or a TensorStore URL (never gs:// or s3://)
    path = path or (kv.get("path", "?") if isinstance(kv, dict) else kv)
    on_store = isinstance(kv, dict) and kv.get("driver") in ("gcs", "s3")
    attempts = CREATE_ATTEMPTS if on_store else 1
    attempt = 1
    while True:  # at most ``attempts`` rounds: the last one returns or raises
        if future is None:
            future = ts.open(spec, context=shared_context(), create=True, delete_existing=True)
        try:
            return future.result()
        except ValueError as e:
            if "ALREADY_EXISTS" not in str(e) or attempt == attempts:
                raise CacheIntegrityError(f"cannot create zarr array {path} (attempt {attempt}): {e}") from e
            logger.warning(
                "meshbatch: creating %s failed with ALREADY_EXISTS, a retried write of its zarr.json "
                "(attempt %d of %d); deleting and creating it again: %s",
                path, attempt, attempts, e,
            )  # fmt: skip
        attempt, future = attempt + 1, None


def _spec(path: str, writable: bool) -> dict:
    # a chunk deleted or rewritten after the open is noticed on the next read, not served from cache
    spec = {"driver": "zarr3", "kvstore": kvstore_spec(path), "recheck_cached_data": True}
    spec["fill_missing_data_reads"] = False  # a missing chunk is an error, never zeros
    if writable:
        # store every written chunk, even all-zero ones, so a missing chunk always means missing data
        spec["store_data_equal_to_fill_value"] = True
    return spec


def _result(future: ts.Future, path: str) -> ts.TensorStore:
    try:
        return future.result()
    except ValueError as e:
        if "NOT_FOUND" in str(e):
            raise FileNotFoundError(f"missing zarr metadata {path}/zarr.json") from e
        raise CacheIntegrityError(f"cannot open zarr array {path}: {e}") from e


def _levanter_metadata(dtype: np.dtype) -> dict:
    return {
        "shape": [ARRAY_SHAPE],
        "data_type": dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [DEFAULT_WRITE_CHUNK_SIZE]}},
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [DEFAULT_CHUNK_SIZE],
                    "codecs": [{"name": "blosc", "configuration": {"clevel": 5}}],
                },
            }
        ],
    }
