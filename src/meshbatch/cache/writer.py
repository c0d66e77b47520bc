"""Writing token caches in Levanter's format, resumably; nothing reads as finished before it is.

A commit makes buffered rows visible, in an order that keeps every reader consistent::

    1. data[tokens : tokens + new]  and  offsets[rows + 1 : rows + k + 1]   (durable: fsync'd files)
    2. offsets[0] = rows + k                                               (Levanter's row count)
    3. <field>/meshbatch_checksums.json   per-chunk CRC-32s of both arrays (atomic rename)
    4. shard_ledger.json {total_num_rows: rows + k, is_finished: false}    (atomic rename: the commit)
    ...
    finish: shard_ledger.json {is_finished: true, field_counts: {...}}

A writer killed at any point leaves a ledger that commits only complete rows (or no ledger yet).
``if_exists="resume"`` reopens it at the ledger's row count, truncates rows written beyond it (those
counted by ``offsets[0]``: their offsets and tokens are zeroed; tokens of a step 1 cut short lie past
every offset and are overwritten as writing goes on), and continues; ``build_cache`` and
``ShardedCacheWriter.write_shard`` skip the inputs already committed. Every ledger carries the
``cache_id`` the cache was created with (a resume keeps it, an overwrite draws a new one), which is
how an open ``TokenCache`` tells a grown cache from a replaced one.
"""

from __future__ import annotations

import logging
import os
import posixpath
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np

from meshbatch.arguments import check_choice, check_int

from .arrays import DEFAULT_CHUNK_SIZE, FieldArrays, create_field, open_field
from .checks import CacheIntegrityError, as_token_dtype, check_dtype, check_name, check_path
from .checksums import Checksums, OffsetsChecksums, RunningChecksums, chunk_crc, read_checksums, sidecar_path
from .files import remove_file, remove_stale_temp_files, write_json_atomic
from .ledger import SHARDED, Ledger, ledger_metadata, remove_ledger, try_read_ledger, write_ledger

logger = logging.getLogger(__name__)

IfExists = Literal["error", "resume", "overwrite"]
DEFAULT_FLUSH_TOKENS = 1 << 25  # 32Mi tokens per commit: each commit rewrites the open zarr shard file


def check_metadata(value) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"metadata must be a mapping or None (got metadata={value!r})")
    return value


class CacheWriter:
    """Appends rows of tokens to a consolidated cache at a local path.

    Args:
        path: cache root.
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
        if "://" in path:
            raise ValueError(f"CacheWriter writes local paths only (got {path=})")
        self.path, self.field = path, check_name("field", field)
        self.flush_tokens = check_int("flush_tokens", flush_tokens, low=1)
        self.dtype = as_token_dtype("dtype", dtype)
        self._metadata = ledger_metadata(check_metadata(metadata))
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0
        self._finished = False
        self._field_root = os.path.join(path, field)
        remove_stale_temp_files(path)
        remove_stale_temp_files(self._field_root)

        existing = try_read_ledger(path)
        if existing is not None and if_exists == "resume":
            self._resume(existing)
            return
        if (existing is not None or os.path.exists(self._field_root)) and if_exists == "error":
            raise FileExistsError(f"a cache already exists at {path}; pass if_exists='resume' or 'overwrite'")
        remove_ledger(path)  # before touching arrays: an old finished ledger must not outlive its data
        remove_file(sidecar_path(self._field_root))
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

    def _commit(self, *, finished: bool) -> Ledger:
        sums = Checksums(
            DEFAULT_CHUNK_SIZE,
            self.dtype,
            self.rows,
            self.tokens,
            tuple(self._data_sums.digests()),
            tuple(self._offsets_sums.digests(self.rows)),
        )
        write_json_atomic(sidecar_path(self._field_root), sums.to_dict())
        ledger = Ledger(
            total_num_rows=self.rows,
            shard_rows={"": self.rows},
            is_finished=finished,
            finished_shards=("",) if finished else (),
            field_counts={self.field: self.tokens},
            metadata=self._metadata,
            cache_id=self.cache_id,
        )
        write_ledger(self.path, ledger)
        return ledger

    def _resume(self, ledger: Ledger) -> None:
        if ledger.is_finished:
            raise ValueError(f"cache at {self.path} is already finished ({ledger.total_num_rows} rows)")
        if ledger.layout == SHARDED:
            raise ValueError(f"cache at {self.path} has a sharded ledger; resume it with ShardedCacheWriter")
        if dict(ledger.metadata) != self._metadata:
            raise ValueError(
                f"cannot resume {self.path}: its ledger metadata {dict(ledger.metadata)} "
                f"differs from {self._metadata}"
            )
        self._arrays = open_field(self.path, self.field, writable=True)
        check_dtype(
            self._arrays.data.dtype.numpy_dtype,
            self.dtype,
            where=posixpath.join(self.path, self.field, "data"),
        )
        self.cache_id = ledger.cache_id or uuid.uuid4().hex
        self.rows = ledger.total_num_rows
        on_disk = int(self._arrays.offsets[0].read().result())
        if on_disk < self.rows:
            raise CacheIntegrityError(
                f"cannot resume {self.path}: offsets[0]={on_disk} < {self.rows} rows the ledger commits"
            )
        self.tokens = int(self._arrays.offsets[self.rows].read().result()) if self.rows else 0
        if ledger.field_counts.get(self.field, self.tokens) != self.tokens:
            raise CacheIntegrityError(
                f"cannot resume {self.path}: offsets[{self.rows}]={self.tokens} but the ledger records "
                f"{ledger.field_counts[self.field]} tokens"
            )
        self._arrays.offsets[0].write(self.rows).result()
        if on_disk > self.rows:  # rows written after the last commit: truncate them
            stale_end = int(self._arrays.offsets[on_disk].read().result())
            zero_offsets = self._arrays.offsets[self.rows + 1 : on_disk + 1].write(0)
            if stale_end > self.tokens:
                self._arrays.data[self.tokens : stale_end].write(0).result()
            zero_offsets.result()
            logger.info("truncated %s from %d uncommitted rows back to %d", self.path, on_disk, self.rows)
        self._data_sums, self._offsets_sums = _resume_checksums(
            self._arrays, self._field_root, rows=self.rows, tokens=self.tokens, dtype=self.dtype
        )
        logger.info("resuming %s at row %d (token %d)", self.path, self.rows, self.tokens)


def _resume_checksums(
    arrays: FieldArrays, field_root: str, *, rows: int, tokens: int, dtype: np.dtype
) -> tuple[RunningChecksums, OffsetsChecksums]:
    """The checksum trackers at the committed ``rows``/``tokens``.

    Full chunks below the commit keep the sidecar's sums (it is written before each ledger, so it
    covers at least the committed rows); partial chunks, and every chunk when the sidecar is missing
    or does not match, are summed from disk.
    """
    size = DEFAULT_CHUNK_SIZE
    try:
        found = read_checksums(field_root)
    except CacheIntegrityError as e:
        logger.warning("ignoring a damaged checksum sidecar; re-summing from disk: %s", e)
        found = None
    usable = found is not None and found.chunk_elements == size and found.dtype == dtype
    full_data, full_offsets = tokens // size, (rows + 1) // size

    def sums(array, stop: int, recorded: tuple[int, ...] | None, first: int = 0) -> list[int]:
        if recorded is not None and len(recorded) >= stop:
            return list(recorded[first:stop])
        logger.info("summing chunks %d..%d of %s from disk", first, stop, field_root)
        return [chunk_crc(array[k * size : (k + 1) * size].read().result()) for k in range(first, stop)]

    data_done = sums(arrays.data, full_data, found.data if usable else None)
    data_tail = arrays.data[full_data * size : tokens].read().result()
    head = arrays.offsets[1 : min(size, rows + 1)].read().result()
    rest_done = sums(arrays.offsets, full_offsets, found.offsets if usable else None, first=1)
    tail_start = max(size, full_offsets * size)
    rest_tail = arrays.offsets[tail_start : rows + 1].read().result() if rows + 1 > tail_start else []
    offsets = OffsetsChecksums(size, head, RunningChecksums(size, np.int64, rest_done, rest_tail))
    return RunningChecksums(size, dtype, data_done, data_tail), offsets
