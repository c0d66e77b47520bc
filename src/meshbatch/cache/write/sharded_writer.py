"""Writing a ``layout: "sharded"`` cache: each shard an ordinary consolidated cache in a subdirectory.

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
import logging
import posixpath
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from meshbatch.arguments import check_choice, check_int
from meshbatch.cache.format.arrays import open_field
from meshbatch.cache.format.checks import as_token_dtype, check_component, check_path, check_relative_path
from meshbatch.cache.format.files import remove_stale_temp_files
from meshbatch.cache.format.ledger import (
    SHARDED,
    Ledger,
    ledger_metadata,
    remove_ledger,
    shard_table,
    try_read_ledger,
    write_ledger,
)
from meshbatch.cache.format.stores import check_inside
from meshbatch.cache.write.writer import (
    DEFAULT_FLUSH_TOKENS,
    CacheWriter,
    IfExists,
    check_metadata,
    check_resume,
)

logger = logging.getLogger(__name__)


class ShardedCacheWriter:
    """Writes a ``layout: "sharded"`` cache (see the module docstring).

    Args:
        root: cache root (local path).
        field: the jagged field written.
        dtype: token dtype on disk.
        if_exists: ``"error"``, ``"resume"`` (skip finished shards) or ``"overwrite"``.
        metadata: ``preprocessor_metadata`` recorded in every ledger; a resume must pass the same.
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
            arrays = open_field(posixpath.join(self.root, name), self.field)
            found = np.dtype(arrays.data.dtype.numpy_dtype)
            if found != self.dtype:
                raise ValueError(
                    f"cannot resume {self.root} with dtype={self.dtype}: shard {name!r} holds {found} tokens "
                    f"({arrays.data_path})"
                )

    @property
    def finished_shards(self) -> tuple[str, ...]:
        return self._ledger.finished_shards

    def write_shard(self, name: str, docs: Iterable, *, flush_tokens: int = DEFAULT_FLUSH_TOKENS) -> int:
        """Writes shard ``name`` from ``docs`` (rows already committed by an earlier run are skipped).

        ``name`` is a relative path inside the cache (``"part-0"``, ``"sub/part-1"``; no ``..``, ``.``
        or empty part, not absolute), unique in the cache: a
        second ``write_shard`` with a name already written is a ``ValueError``; on a resumed writer
        (``if_exists="resume"``) the first call with the name of a shard an earlier run finished
        returns its row count without reading ``docs``.

        Returns:
            The shard's row count.
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
        shard_table(Ledger(0, {name: 0}, finished_shards=(name,), layout=SHARDED), self.field)  # name check
        shard_root = posixpath.join(self.root, name)
        check_inside(self.root, shard_root, what=f"shard {name!r}")  # no symlink out
        done = try_read_ledger(shard_root) if self._resumed else None
        if done is not None and done.is_finished:  # finished, but killed before the top ledger listed it
            if dict(done.metadata) != self._metadata or self.field not in done.field_counts:
                raise ValueError(f"cannot adopt finished shard {shard_root}: ledger {done.to_dict()}")
            arrays = open_field(shard_root, self.field)
            found = np.dtype(arrays.data.dtype.numpy_dtype)
            if found != self.dtype:
                raise ValueError(
                    f"cannot adopt finished shard {shard_root}: {arrays.data_path} has dtype {found}, "
                    f"expected {self.dtype}"
                )
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
