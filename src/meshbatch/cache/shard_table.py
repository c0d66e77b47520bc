"""The table of a ``layout: "sharded"`` ledger: its finished shards in global row order, checked.

{"finished_shards": ["part-0", "part-1"], "shard_rows": {"part-0": 2, "part-1": 3},
 "field_counts_by_shard": {"part-0": {"input_ids": 7}, "part-1": {"input_ids": 9}}}
-> [ShardEntry("part-0", rows=2, tokens=7), ShardEntry("part-1", rows=3, tokens=9)]
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .checks import CacheIntegrityError
from .ledger import Ledger


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a sharded ledger: its relative directory, rows and tokens of the read field."""

    name: str
    rows: int
    tokens: int


def shard_table(ledger: Ledger, field_name: str) -> list[ShardEntry]:
    """Validates a sharded ledger and returns its finished shards in global row order.

    Raises:
        CacheIntegrityError: a shard path that is absolute, a URL, empty, escapes with ``..`` or repeats; a
            missing or negative row count; rows not summing to ``total_num_rows``; a non-empty shard
            without a ``field_name`` count; counts for unknown shards; aggregate counts that disagree.
    """
    entries: list[ShardEntry] = []
    seen: set[str] = set()
    for name in ledger.finished_shards:
        if not name or "://" in name or posixpath.isabs(name) or ".." in name.split("/"):
            raise CacheIntegrityError(
                f"sharded ledger shard path must be a relative subdirectory (got {name!r})"
            )
        if name in seen:
            raise CacheIntegrityError(f"sharded ledger lists shard {name!r} twice in finished_shards")
        seen.add(name)
        if name not in ledger.shard_rows:
            raise CacheIntegrityError(
                f"sharded ledger has no shard_rows entry (row count) for shard {name!r}"
            )
        rows = ledger.shard_rows[name]
        if rows < 0:
            raise CacheIntegrityError(f"sharded ledger has negative row count for shard {name!r}: {rows}")
        tokens = ledger.field_counts_by_shard.get(name, {}).get(field_name)
        if tokens is None:
            if rows:
                raise CacheIntegrityError(
                    f"sharded ledger has no field_counts_by_shard[{name!r}][{field_name!r}] "
                    f"for non-empty shard {name!r} ({rows} rows)"
                )
            tokens = 0
        if tokens < 0:
            raise CacheIntegrityError(
                f"sharded ledger has negative {field_name} count for shard {name!r}: {tokens}"
            )
        entries.append(ShardEntry(name, rows, tokens))

    row_sum = sum(e.rows for e in entries)
    if row_sum != ledger.total_num_rows:
        raise CacheIntegrityError(
            f"sharded ledger row count mismatch: sum of finished shard rows = {row_sum}, "
            f"total_num_rows = {ledger.total_num_rows}"
        )
    unknown = sorted(set(ledger.field_counts_by_shard) - seen)
    if unknown:
        raise CacheIntegrityError(f"sharded ledger has field_counts_by_shard for unknown shards {unknown}")
    token_sum = sum(e.tokens for e in entries)
    recorded = ledger.field_counts.get(field_name)
    if recorded is not None and recorded != token_sum:
        raise CacheIntegrityError(
            f"sharded ledger {field_name} count mismatch: sum over shards = {token_sum}, "
            f"field_counts[{field_name!r}] = {recorded}"
        )
    return entries
