"""The table of a ``layout: "sharded"`` ledger: its finished shards in global row order, checked.

{"finished_shards": ["part-0", "part-1"], "shard_rows": {"part-0": 2, "part-1": 3},
 "field_counts_by_shard": {"part-0": {"input_ids": 7}, "part-1": {"input_ids": 9}}}
-> [ShardEntry("part-0", rows=2, tokens=7), ShardEntry("part-1", rows=3, tokens=9)]

A shard name is a relative path of plain names (``check_relative_path``, as ``write_shard`` takes
it), so two names never spell one directory: ``"./p0"``, ``"p0/"`` and ``".//p0"`` beside ``"p0"``
served p0's rows twice before they were refused. ``shard_root`` joins a name to the cache root and
refuses a local shard directory that a symlink leads out of the root (``localpaths``);
``check_distinct_shards`` refuses two names that symlinks resolve to one directory.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

from meshbatch.cache.format.checks import CacheIntegrityError, check_relative_path
from meshbatch.cache.format.ledger import Ledger
from meshbatch.cache.format.localpaths import check_inside, local_path


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a sharded ledger: its relative directory, rows and tokens of the read field."""

    name: str
    rows: int
    tokens: int


def shard_table(ledger: Ledger, field_name: str, *, where: str | None = None) -> list[ShardEntry]:
    """Validates a sharded ledger and returns its finished shards in global row order.

    Args:
        ledger: the parsed ledger.
        field_name: the field read.
        where: the ledger file, named in messages.

    Raises:
        CacheIntegrityError: a shard path that is absolute, a URL, empty, has a ``.``, ``..`` or empty
            part (``"./p0"``, ``"p0/"``, ``"a//b"``) or repeats; a missing or negative row count; rows
            not summing to ``total_num_rows``; a non-empty shard without a ``field_name`` count;
            counts for unknown shards; aggregate counts that disagree.
    """
    sharded = f"sharded ledger {where}" if where else "sharded ledger"
    entries: list[ShardEntry] = []
    seen: set[str] = set()
    for name in ledger.finished_shards:
        try:
            check_relative_path("shard", name)
        except ValueError as e:
            raise CacheIntegrityError(
                f"{sharded}: shard path must be a relative subdirectory (got {name!r}): names joined "
                "by '/', no '.', '..' or empty part, not absolute, no '\\' or NUL"
            ) from e
        if name in seen:
            raise CacheIntegrityError(f"{sharded} lists shard {name!r} twice in finished_shards")
        seen.add(name)
        if name not in ledger.shard_rows:
            raise CacheIntegrityError(f"{sharded} has no shard_rows entry (row count) for shard {name!r}")
        rows = ledger.shard_rows[name]
        if rows < 0:
            raise CacheIntegrityError(f"{sharded} has negative row count for shard {name!r}: {rows}")
        tokens = ledger.field_counts_by_shard.get(name, {}).get(field_name)
        if tokens is None:
            if rows:
                raise CacheIntegrityError(
                    f"{sharded} has no field_counts_by_shard[{name!r}][{field_name!r}] "
                    f"for non-empty shard {name!r} ({rows} rows)"
                )
            tokens = 0
        if tokens < 0:
            raise CacheIntegrityError(
                f"{sharded} has negative {field_name} count for shard {name!r}: {tokens}"
            )
        entries.append(ShardEntry(name, rows, tokens))

    row_sum = sum(e.rows for e in entries)
    if row_sum != ledger.total_num_rows:
        raise CacheIntegrityError(
            f"{sharded}: row count mismatch: sum of finished shard rows = {row_sum}, "
            f"total_num_rows = {ledger.total_num_rows}"
        )
    unknown = sorted(set(ledger.field_counts_by_shard) - seen)
    if unknown:
        raise CacheIntegrityError(f"{sharded} has field_counts_by_shard for unknown shards {unknown}")
    token_sum = sum(e.tokens for e in entries)
    recorded = ledger.field_counts.get(field_name)
    if recorded is not None and recorded != token_sum:
        raise CacheIntegrityError(
            f"{sharded}: {field_name} count mismatch: sum over shards = {token_sum}, "
            f"field_counts[{field_name!r}] = {recorded}"
        )
    return entries


def shard_root(root: str, name: str) -> str:
    """The directory of shard ``name`` (from a checked ``shard_table``) of the cache at ``root``.

    Raises:
        CacheIntegrityError: a local shard directory that resolves outside ``root`` (a symlink).
    """
    path = posixpath.join(root, name)
    check_inside(root, path, what=f"shard {name!r}")
    return path


def check_distinct_shards(root: str, names: list[str]) -> None:
    """Refuses two shard names of a local cache that resolve (through symlinks) to one directory.

    Raises:
        CacheIntegrityError: naming both shards and the directory.
    """
    local = local_path(root)
    if local is None:
        return  # an object store has no symlinks: distinct names are distinct prefixes
    owner: dict[str, str] = {}
    for name in names:
        real = os.path.realpath(os.path.join(local, name))
        if real in owner:
            raise CacheIntegrityError(
                f"sharded cache {root}: shards {owner[real]!r} and {name!r} are one directory {real} "
                "(a symlink inside the cache): its rows would be served twice"
            )
        owner[real] = name
