"""Writing token caches in Levanter's format, resumably; nothing reads as finished before it is.

A commit makes buffered rows visible, in an order that keeps every reader consistent::

    1. data[tokens : tokens + new]  and  offsets[rows + 1 : rows + k + 1]   (durable: fsync'd files)
    2. offsets[0] = rows + k                                               (Levanter's row count)
    3. <field>/meshbatch_checksums.json   per-chunk CRC-32s of both arrays (atomic rename)
    4. shard_ledger.json {total_num_rows: rows + k, is_finished: false}    (atomic rename: the commit)
    ...
    finish: shard_ledger.json {is_finished: true, field_counts: {...}}

A writer killed at any point leaves a ledger that commits only complete rows (or no ledger yet).
Opening a writer first deletes what killed writers left: ``*.json.tmp-*`` files and TensorStore's
``*.__lock`` files (``files.py``: reused, the latter tore shards). ``if_exists="resume"`` reopens the
cache at the ledger's row count, checks the chunks it sums again against the sidecar before writing
anything (``resume.py``: damage is refused by name, never re-summed), zeroes every offset and token
written past the commit (a resumed cache equals a clean build), and continues; ``build_cache`` and
``ShardedCacheWriter.write_shard`` skip the inputs already committed. Every ledger carries the
``cache_id`` the cache was created with (a resume keeps it, an overwrite draws a new one), which is
how an open ``TokenCache`` tells a grown cache from a replaced one.

``ShardedCacheWriter`` writes a ``layout: "sharded"`` cache: each shard an ordinary consolidated
cache in a subdirectory, written by a ``CacheWriter``::

    writer = ShardedCacheWriter("/c")
    writer.write_shard("part-0", docs_0)   # /c/part-0/: a finished consolidated cache, and
                                           # /c/shard_ledger.json: {"finished_shards": ["part-0"], ...}
    writer.write_shard("part-1", docs_1)
    writer.finish()                        # /c/shard_ledger.json {"is_finished": true, ...}

The top-level ledger lists shards as they finish (so readers can start early), in write order, which
is the global row order. Resuming skips finished shards and resumes the interrupted one; a resume
with another ``field`` or ``dtype`` than the finished shards is refused before anything is written.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import posixpath
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np

from meshbatch.arguments import check_choice, check_int
from meshbatch.cache.format.arrays import DEFAULT_CHUNK_SIZE, create_field, open_field
from meshbatch.cache.format.checks import (
    CacheIntegrityError,
    as_token_dtype,
    check_component,
    check_dtype,
    check_path,
    check_relative_path,
)
from meshbatch.cache.format.files import (
    directory_exists,
    remove_file,
    remove_stale_lock_files,
    remove_stale_temp_files,
    write_json_atomic,
)
from meshbatch.cache.format.ledger import (
    SHARDED,
    Ledger,
    ledger_metadata,
    remove_ledger,
    shard_root,
    try_read_ledger,
    write_ledger,
)
from meshbatch.cache.format.stores import check_field_inside
from meshbatch.cache.integrity.checksums import Checksums, OffsetsChecksums, RunningChecksums, sidecar_path
from meshbatch.cache.integrity.resume import committed_sidecar, read_range, resume_checksums, zero_past

logger = logging.getLogger(__name__)

IfExists = Literal["error", "resume", "overwrite"]
DEFAULT_FLUSH_TOKENS = 1 << 25  # 32Mi tokens per commit: each commit rewrites the open zarr shard file


def remove_commit(path: str, fields) -> None:
    """Removes the ledger at ``path``, then the checksum sidecar of each of ``fields``: before any
    array is rewritten, so an old finished ledger never outlives its data, nor a sidecar its sums."""
    remove_ledger(path)
    for field in fields:
        remove_file(sidecar_path(posixpath.join(path, field)))


def check_resume(path: str, ledger: Ledger, metadata: dict, field: str, fields) -> None:
    """Refuses to resume ``path`` under other ledger metadata, or with a ``field`` that is not
    among the ``fields`` it holds (none recorded: any field)."""
    if dict(ledger.metadata) != metadata:
        raise ValueError(
            f"cannot resume {path}: its ledger metadata {dict(ledger.metadata)} differs from {metadata}"
        )
    if fields and field not in fields:
        raise ValueError(f"cannot resume {path} with field={field!r}: it holds field(s) {sorted(fields)}")


def check_metadata(value) -> Mapping[str, Any] | None:
    """``metadata``: None or a mapping that JSON can hold exactly (it goes into the ledger).

    Raises:
        TypeError: not a mapping, or a value JSON cannot hold (``{"f": open}``), named.
        ValueError: NaN or infinity, or a circular reference, named.
    """
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"metadata must be a mapping or None (got metadata={value!r})")
    if value is not None:
        try:
            json.dumps(dict(value), allow_nan=False)
        except TypeError as e:
            raise TypeError(f"metadata must be JSON-serialisable: {e} (got metadata={value!r:.200})") from e
        except ValueError as e:
            raise ValueError(f"metadata must be finite JSON: {e} (got metadata={value!r:.200})") from e
    return value


class CacheWriter:
    """Appends rows of tokens to a consolidated cache at a local path or ``gs://`` / ``s3://`` URL.

    Args:
        path: cache root (a local path or an object-store URL, see ``stores.py``).
        field: the jagged field written (Levanter's ``input_ids``).
        dtype: token dtype on disk; with ``if_exists="resume"`` it must match the existing cache's.
        if_exists: what to do with an existing cache: ``"error"``, ``"resume"`` from its committed rows,
            or ``"overwrite"`` it (its ledger is removed first, so it never reads as finished).
        metadata: ``preprocessor_metadata`` recorded in the ledger; a resume must pass the same.
        flush_tokens: buffered tokens that trigger a commit.

    Use as a context manager: leaving the block without an exception finishes the cache; an
    exception leaves the committed rows for a later resume and drops the buffered ones.

    Raises:
        TypeError, ValueError: a bad argument, named.
        FileExistsError: a cache exists and ``if_exists="error"``.
    """

    def __init__(
        self,
        path: str,
        *,
        field: str = "input_ids",
        dtype: np.dtype | str = "int32",
        if_exists: IfExists = "error",
        metadata: Mapping[str, Any] | None = None,
        flush_tokens: int = DEFAULT_FLUSH_TOKENS,
    ):
        path = check_path("path", path)
        check_choice("if_exists", if_exists, IfExists)
        self.path, self.field = path, check_component("field", field)
        self.flush_tokens = check_int("flush_tokens", flush_tokens, low=1)
        self.dtype = as_token_dtype("dtype", dtype)
        self._metadata = ledger_metadata(check_metadata(metadata))
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0
        self._finished = False
        self._field_root = posixpath.join(path, field)
        check_field_inside(path, field)  # before any cleanup or write: no symlink leads out
        remove_stale_temp_files(path)
        remove_stale_temp_files(self._field_root)
        remove_stale_lock_files(self._field_root)  # before any write: see files.py

        existing = try_read_ledger(path)
        if existing is not None and if_exists == "resume":
            self._resume(existing)
            return
        if (existing is not None or directory_exists(self._field_root)) and if_exists == "error":
            raise FileExistsError(f"a cache already exists at {path}; pass if_exists='resume' or 'overwrite'")
        remove_commit(path, [field])
        self.cache_id = uuid.uuid4().hex
        self._arrays = create_field(path, field, self.dtype)
        self.rows = self.tokens = 0
        self._data_sums = RunningChecksums(DEFAULT_CHUNK_SIZE, self.dtype, [], np.zeros(0, self.dtype))
        self._offsets_sums = OffsetsChecksums(
            DEFAULT_CHUNK_SIZE,
            np.zeros(0, np.int64),
            RunningChecksums(DEFAULT_CHUNK_SIZE, np.int64, [], np.zeros(0, np.int64)),
        )
        self._arrays.offsets[0].write(0).result()
        self._commit(finished=False)

    @property
    def num_rows(self) -> int:
        """Rows written so far: committed plus buffered."""
        return self.rows + len(self._pending)

    def write(self, docs: Iterable) -> None:
        """Appends rows; each is a 1-D integer array-like whose values fit the cache dtype."""
        if isinstance(docs, str | bytes) or not isinstance(docs, Iterable):
            raise TypeError(f"docs must be an iterable of token arrays (got docs={docs!r:.80})")
        info = np.iinfo(self.dtype)
        for doc in docs:
            arr = np.asarray(doc)
            if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
                raise ValueError(
                    f"row {self.num_rows} must be a 1-D integer array "
                    f"(got shape={arr.shape}, dtype={arr.dtype})"
                )
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise ValueError(
                    f"row {self.num_rows} has token values in [{arr.min()}, {arr.max()}] outside {self.dtype}"
                )
            self._pending.append(arr.astype(self.dtype, copy=False))
            self._pending_tokens += arr.size
            if self._pending_tokens >= self.flush_tokens:
                self.flush()

    def flush(self) -> None:
        """Commits buffered rows (see the module docstring for the order of writes)."""
        if self._finished:
            raise ValueError(f"cache at {self.path} is finished; no more rows can be written")
        if not self._pending:
            return
        data = np.concatenate(self._pending)
        ends = np.cumsum([len(p) for p in self._pending], dtype=np.int64) + self.tokens
        k = len(self._pending)
        data_write = self._arrays.data[self.tokens : self.tokens + data.size].write(data)
        offsets_write = self._arrays.offsets[self.rows + 1 : self.rows + k + 1].write(ends)
        data_write.result()
        offsets_write.result()
        self._arrays.offsets[0].write(self.rows + k).result()
        self._data_sums.append(data)
        self._offsets_sums.append(ends)
        self.rows, self.tokens = self.rows + k, self.tokens + int(data.size)
        self._pending, self._pending_tokens = [], 0
        self._commit(finished=False)
        logger.debug("committed %d rows (%d tokens) to %s", self.rows, self.tokens, self.path)

    def finish(self) -> Ledger:
        """Commits buffered rows and marks the cache finished; returns the final ledger."""
        self.flush()
        ledger = self._commit(finished=True)
        self._finished = True
        logger.info("finished cache %s: %d rows, %d tokens", self.path, self.rows, self.tokens)
        return ledger

    def __enter__(self) -> CacheWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and not self._finished:
            self.finish()

    def _write_sidecar(self) -> None:
        sums = Checksums(
            DEFAULT_CHUNK_SIZE,
            self.dtype,
            self.rows,
            self.tokens,
            tuple(self._data_sums.digests()),
            tuple(self._offsets_sums.digests(self.rows)),
        )
        write_json_atomic(sidecar_path(self._field_root), sums.to_dict())

    def _commit(self, *, finished: bool) -> Ledger:
        self._write_sidecar()
        ledger = Ledger(
            total_num_rows=self.rows,
            shard_rows={"": self.rows},
            is_finished=finished,
            finished_shards=("",) if finished else (),
            field_counts={self.field: self.tokens},
            metadata=self._metadata,
            cache_id=self.cache_id,
            meshbatch_checksums=True,  # the sidecar above goes with every ledger: readers require it
        )
        write_ledger(self.path, ledger)
        return ledger

    def _resume(self, ledger: Ledger) -> None:
        if ledger.is_finished:
            raise ValueError(f"cache at {self.path} is already finished ({ledger.total_num_rows} rows)")
        if ledger.layout == SHARDED:
            raise ValueError(f"cache at {self.path} has a sharded ledger; resume it with ShardedCacheWriter")
        check_resume(self.path, ledger, self._metadata, self.field, ledger.field_counts)
        self._arrays = open_field(self.path, self.field, writable=True)
        offsets, data = self._arrays.offsets, self._arrays.data
        offsets_where, data_where = posixpath.join(self._field_root, "offsets"), self._arrays.data_path
        check_dtype(data.dtype.numpy_dtype, self.dtype, where=data_where)
        self.cache_id = ledger.cache_id or uuid.uuid4().hex
        self.rows = ledger.total_num_rows
        on_disk = int(read_range(offsets, 0, 1, where=offsets_where, path=self.path)[0])
        if on_disk < self.rows:
            raise CacheIntegrityError(
                f"cannot resume {self.path}: offsets[0]={on_disk} < {self.rows} rows the ledger commits"
            )
        rows = self.rows
        self.tokens = (
            int(read_range(offsets, rows, rows + 1, where=offsets_where, path=self.path)[0]) if rows else 0
        )
        if ledger.field_counts.get(self.field, self.tokens) != self.tokens:
            raise CacheIntegrityError(
                f"cannot resume {self.path}: offsets[{self.rows}]={self.tokens} but the ledger records "
                f"{ledger.field_counts[self.field]} tokens"
            )
        # nothing is written before what is summed again is checked against the sidecar (resume.py)
        sums = committed_sidecar(
            self._field_root,
            path=self.path,
            rows=rows,
            tokens=self.tokens,
            dtype=self.dtype,
            cache_id=ledger.cache_id,
        )
        self._data_sums, self._offsets_sums = resume_checksums(
            self._arrays, sums, path=self.path, rows=rows, tokens=self.tokens, dtype=self.dtype
        )
        if sums is not None and (sums.rows, sums.tokens) != (rows, self.tokens):
            self._write_sidecar()  # cut back to the commit before anything past it is zeroed
        offsets[0].write(rows).result()
        # rows and tokens a killed flush wrote past the commit (offsets[0] may or may not count them)
        stale = zero_past(offsets, rows + 1, where=offsets_where, path=self.path) + zero_past(
            data, self.tokens, where=data_where, path=self.path
        )
        if stale or on_disk > rows:
            logger.info(
                "truncated %s back to its %d committed rows (offsets[0] was %d; %d stale values zeroed)",
                self.path,
                rows,
                on_disk,
                stale,
            )
        logger.info("resuming %s at row %d (token %d)", self.path, rows, self.tokens)


class ShardedCacheWriter:
    """Writes a ``layout: "sharded"`` cache at ``root`` (see the module docstring).

    The arguments are ``CacheWriter``'s, for every shard (``metadata`` goes into every ledger);
    ``if_exists="resume"`` skips the finished shards.
    """

    def __init__(
        self,
        root: str,
        *,
        field: str = "input_ids",
        dtype: np.dtype | str = "int32",
        if_exists: IfExists = "error",
        metadata: Mapping[str, Any] | None = None,
    ):
        root = check_path("root", root)
        check_choice("if_exists", if_exists, IfExists)
        self.root, self.field = root, check_component("field", field)
        self.dtype = as_token_dtype("dtype", dtype)
        self._metadata = ledger_metadata(check_metadata(metadata))
        remove_stale_temp_files(root)
        existing = try_read_ledger(root)
        if existing is not None and if_exists == "error":
            raise FileExistsError(f"a cache already exists at {root}; pass if_exists='resume' or 'overwrite'")
        self._resumed = existing is not None and if_exists == "resume"
        if self._resumed:
            if existing.layout != SHARDED or existing.is_finished:
                raise ValueError(
                    f"cannot resume {root}: layout={existing.layout!r}, is_finished={existing.is_finished}"
                )
            self._check_resumable(existing)
            self._ledger = dataclasses.replace(existing, cache_id=existing.cache_id or uuid.uuid4().hex)
        else:
            remove_ledger(root)
            self._ledger = Ledger(0, {}, layout=SHARDED, metadata=self._metadata, cache_id=uuid.uuid4().hex)
            write_ledger(root, self._ledger)
        self._shard_if_exists: IfExists = "resume" if self._resumed else if_exists
        self._written: set[str] = set()  # shard names passed to write_shard by this writer

    def _check_resumable(self, ledger: Ledger) -> None:
        """Refuses, before anything is written, a resume whose metadata, ``field`` or ``dtype`` differs
        from the shards already finished (the cache it would finish could not be read): the ledger's
        metadata and fields, and the dtype of the first finished shard (each resumed or adopted shard
        is checked again)."""
        fields = {
            *ledger.field_counts,
            *(f for counts in ledger.field_counts_by_shard.values() for f in counts),
        }
        check_resume(self.root, ledger, self._metadata, self.field, fields)
        if ledger.finished_shards:
            name = ledger.finished_shards[0]
            found, where = self._shard_dtype(posixpath.join(self.root, name))
            if found != self.dtype:
                raise ValueError(
                    f"cannot resume {self.root} with dtype={self.dtype}: shard {name!r} holds {found} tokens "
                    f"({where})"
                )

    def _shard_dtype(self, directory: str) -> tuple[np.dtype, str]:
        """The token dtype of a finished shard, and its data array's path."""
        arrays = open_field(directory, self.field)
        return np.dtype(arrays.data.dtype.numpy_dtype), arrays.data_path

    @property
    def finished_shards(self) -> tuple[str, ...]:
        return self._ledger.finished_shards

    def write_shard(self, name: str, docs: Iterable, *, flush_tokens: int = DEFAULT_FLUSH_TOKENS) -> int:
        """Writes shard ``name`` from ``docs`` (rows already committed by an earlier run are skipped).

        ``name`` is a relative path inside the cache (``"part-0"``, ``"sub/part-1"``; no ``..``, ``.``
        or empty part, not absolute), unique in the cache: a second ``write_shard`` with a name
        already written is a ``ValueError``; on a resumed writer the first call with the name of a
        shard an earlier run finished returns its row count without reading ``docs``. Returns the
        shard's row count.
        """
        name = check_relative_path("name", name)
        check_int("flush_tokens", flush_tokens, low=1)
        if name in self._written or (name in self._ledger.finished_shards and not self._resumed):
            raise ValueError(
                f"shard {name!r} is already written to {self.root}: shard names must be unique "
                f"(got write_shard(name={name!r}) twice)"
            )
        self._written.add(name)
        if name in self._ledger.finished_shards:  # resumed: finished by an earlier run
            logger.info("shard %s of %s already finished; skipping", name, self.root)
            return self._ledger.shard_rows[name]
        directory = shard_root(self.root, name)  # no symlink out
        done = try_read_ledger(directory) if self._resumed else None
        if done is not None and done.is_finished:  # finished, but killed before the top ledger listed it
            if dict(done.metadata) != self._metadata or self.field not in done.field_counts:
                raise ValueError(f"cannot adopt finished shard {directory}: ledger {done.to_dict()}")
            found, where = self._shard_dtype(directory)
            if found != self.dtype:
                raise ValueError(
                    f"cannot adopt finished shard {directory}: {where} has dtype {found}, "
                    f"expected {self.dtype}"
                )
            rows, tokens = done.total_num_rows, done.field_counts[self.field]
        else:
            with CacheWriter(
                directory,
                field=self.field,
                dtype=self.dtype,
                if_exists=self._shard_if_exists,
                metadata=self._metadata["preprocessor_metadata"],
                flush_tokens=flush_tokens,
            ) as writer:
                writer.write(itertools.islice(docs, writer.num_rows, None))
            rows, tokens = writer.rows, writer.tokens
        old = self._ledger
        self._ledger = dataclasses.replace(
            old,
            total_num_rows=old.total_num_rows + rows,
            shard_rows={**old.shard_rows, name: rows},
            finished_shards=(*old.finished_shards, name),
            field_counts={self.field: old.field_counts.get(self.field, 0) + tokens},
            field_counts_by_shard={**old.field_counts_by_shard, name: {self.field: tokens}},
        )
        write_ledger(self.root, self._ledger)
        return rows

    def finish(self) -> Ledger:
        """Marks the sharded cache finished; returns its ledger."""
        self._ledger = dataclasses.replace(self._ledger, is_finished=True)
        write_ledger(self.root, self._ledger)
        return self._ledger
