"""Writing token caches in Levanter's format, resumably; nothing reads as finished before it is.

A commit makes buffered rows visible, in an order that keeps every reader consistent::

    1. data[tokens : tokens + new]  and  offsets[rows + 1 : rows + k + 1]   (durable: fsync'd files)
    2. offsets[0] = rows + k                                               (Levanter's row count)
    3. shard_ledger.json {total_num_rows: rows + k, is_finished: false}    (atomic rename: the commit)
    ...
    finish: shard_ledger.json {is_finished: true, field_counts: {...}}

A writer killed at any point leaves a ledger that commits only complete rows (or no ledger yet).
``if_exists="resume"`` reopens it at the ledger's row count, truncates rows written beyond it (those
counted by ``offsets[0]``: their offsets and tokens are zeroed; tokens of a step 1 cut short lie past
every offset and are overwritten as writing goes on), and continues; ``build_cache`` and
``ShardedCacheWriter.write_shard`` skip the inputs already committed.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import posixpath
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np

from .arrays import create_field, open_field
from .ledger import (
    SHARDED,
    Ledger,
    ledger_metadata,
    remove_ledger,
    shard_table,
    try_read_ledger,
    write_ledger,
)
from .validate import check_dtype

logger = logging.getLogger(__name__)

IfExists = Literal["error", "resume", "overwrite"]
DEFAULT_FLUSH_TOKENS = 1 << 25  # 32Mi tokens per commit: each commit rewrites the open zarr shard file


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
        if if_exists not in ("error", "resume", "overwrite"):
            raise ValueError(f"if_exists must be 'error', 'resume' or 'overwrite' (got {if_exists=})")
        if "://" in path:
            raise ValueError(f"CacheWriter writes local paths only (got {path=})")
        if flush_tokens <= 0:
            raise ValueError(f"flush_tokens must be > 0 (got {flush_tokens=})")
        self.path, self.field, self.flush_tokens = path, field, flush_tokens
        self.dtype = np.dtype(dtype)
        if not np.issubdtype(self.dtype, np.integer):
            raise ValueError(f"token dtype must be an integer type (got dtype={self.dtype})")
        self._metadata = ledger_metadata(metadata)
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0
        self._finished = False

        existing = try_read_ledger(path)
        field_dir = os.path.join(path, field)
        if existing is not None and if_exists == "resume":
            self._resume(existing)
            return
        if (existing is not None or os.path.exists(field_dir)) and if_exists == "error":
            raise FileExistsError(f"a cache already exists at {path}; pass if_exists='resume' or 'overwrite'")
        remove_ledger(path)  # before touching arrays: an old finished ledger must not outlive its data
        self._arrays = create_field(path, field, self.dtype)
        self.rows = self.tokens = 0
        self._arrays.offsets[0].write(0).result()
        self._commit(finished=False)

    @property
    def num_rows(self) -> int:
        """Rows written so far: committed plus buffered."""
        return self.rows + len(self._pending)

    def write(self, docs: Iterable) -> None:
        """Appends rows; each is a 1-D integer array-like whose values fit the cache dtype."""
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
        ledger = Ledger(
            total_num_rows=self.rows,
            shard_rows={"": self.rows},
            is_finished=finished,
            finished_shards=("",) if finished else (),
            field_counts={self.field: self.tokens},
            metadata=self._metadata,
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
        self.rows = ledger.total_num_rows
        on_disk = int(self._arrays.offsets[0].read().result())
        if on_disk < self.rows:
            raise ValueError(
                f"cannot resume {self.path}: offsets[0]={on_disk} < {self.rows} rows the ledger commits"
            )
        self.tokens = int(self._arrays.offsets[self.rows].read().result()) if self.rows else 0
        if ledger.field_counts.get(self.field, self.tokens) != self.tokens:
            raise ValueError(
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
        logger.info("resuming %s at row %d (token %d)", self.path, self.rows, self.tokens)


class ShardedCacheWriter:
    """Writes a ``layout: "sharded"`` cache: each shard a consolidated cache in ``<root>/<name>/``.

    The top-level ledger lists shards as they finish (so readers can start early), in write order, which
    is the global row order. Resuming skips finished shards and resumes the interrupted one.
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
        self.root, self.field, self.dtype = root, field, np.dtype(dtype)
        self._metadata = ledger_metadata(metadata)
        existing = try_read_ledger(root)
        if existing is not None and if_exists == "error":
            raise FileExistsError(f"a cache already exists at {root}; pass if_exists='resume' or 'overwrite'")
        self._resumed = existing is not None and if_exists == "resume"
        if self._resumed:
            if existing.layout != SHARDED or existing.is_finished:
                raise ValueError(
                    f"cannot resume {root}: layout={existing.layout!r}, is_finished={existing.is_finished}"
                )
            self._ledger = existing
        else:
            remove_ledger(root)
            self._ledger = Ledger(0, {}, layout=SHARDED, metadata=self._metadata)
            write_ledger(root, self._ledger)
        self._shard_if_exists: IfExists = "resume" if self._resumed else if_exists

    @property
    def finished_shards(self) -> tuple[str, ...]:
        return self._ledger.finished_shards

    def write_shard(self, name: str, docs: Iterable, *, flush_tokens: int = DEFAULT_FLUSH_TOKENS) -> int:
        """Writes shard ``name`` from ``docs`` (rows already committed by an earlier run are skipped).

        Returns:
            The shard's row count.
        """
        if name in self._ledger.finished_shards:
            logger.info("shard %s of %s already finished; skipping", name, self.root)
            return self._ledger.shard_rows[name]
        shard_table(Ledger(0, {name: 0}, finished_shards=(name,), layout=SHARDED), self.field)  # name check
        shard_root = posixpath.join(self.root, name)
        done = try_read_ledger(shard_root) if self._resumed else None
        if done is not None and done.is_finished:  # finished, but killed before the top ledger listed it
            if dict(done.metadata) != self._metadata or self.field not in done.field_counts:
                raise ValueError(f"cannot adopt finished shard {shard_root}: ledger {done.to_dict()}")
            rows, tokens = done.total_num_rows, done.field_counts[self.field]
        else:
            with CacheWriter(
                shard_root,
                field=self.field,
                dtype=self.dtype,
                if_exists=self._shard_if_exists,
                metadata=self._metadata["preprocessor_metadata"],
                flush_tokens=flush_tokens,
            ) as writer:
                writer.write(itertools.islice(docs, writer.num_rows, None))
            rows, tokens = writer.rows, writer.tokens
        old = self._ledger
        self._ledger = Ledger(
            total_num_rows=old.total_num_rows + rows,
            shard_rows={**old.shard_rows, name: rows},
            finished_shards=(*old.finished_shards, name),
            field_counts={self.field: old.field_counts.get(self.field, 0) + tokens},
            field_counts_by_shard={**old.field_counts_by_shard, name: {self.field: tokens}},
            layout=SHARDED,
            metadata=old.metadata,
        )
        write_ledger(self.root, self._ledger)
        return rows

    def finish(self) -> Ledger:
        """Marks the sharded cache finished; returns its ledger."""
        self._ledger = dataclasses.replace(self._ledger, is_finished=True)
        write_ledger(self.root, self._ledger)
        return self._ledger
