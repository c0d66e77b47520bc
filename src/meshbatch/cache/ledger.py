"""The ledger: ``shard_ledger.json``, the one file that says what a token cache holds.

A Levanter cache is committed by its ledger. Two layouts exist:

- ``consolidated`` (the installed Levanter's only layout; ``layout`` absent means this): the field's
  ``offsets``/``data`` arrays sit under the cache root.
- ``sharded`` (newer Levanter): the root holds only the ledger; rows live in per-shard
  subdirectories, each an ordinary consolidated cache, concatenated in ``finished_shards`` order::

      {"layout": "sharded", "total_num_rows": 5, "is_finished": true,
       "finished_shards": ["part-0", "part-1"], "shard_rows": {"part-0": 2, "part-1": 3},
       "field_counts_by_shard": {"part-0": {"input_ids": 7}, "part-1": {"input_ids": 9}},
       "field_counts": {"input_ids": 16}, ...}
      rows 0-1 -> <root>/part-0, rows 2-4 -> <root>/part-1; tokens 0-6 and 7-15 likewise

Ledgers are read through TensorStore's kvstore (so any TensorStore URL works) and written locally
by an atomic temp-file + fsync + rename, so a reader sees either the old ledger or the new one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import tensorstore as ts

from .arrays import kvstore_spec, shared_context

logger = logging.getLogger(__name__)

LEDGER_FILE_NAME = "shard_ledger.json"
CONSOLIDATED = "consolidated"
SHARDED = "sharded"
Layout = Literal["consolidated", "sharded"]


@dataclass(frozen=True)
class Ledger:
    """The parsed ``shard_ledger.json``; field names and JSON keys are Levanter's ``CacheLedger``'s."""

    total_num_rows: int
    shard_rows: Mapping[str, int]
    is_finished: bool = False
    finished_shards: tuple[str, ...] = ()
    field_counts: Mapping[str, int] = field(default_factory=dict)
    field_counts_by_shard: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    layout: Layout = CONSOLIDATED
    metadata: Mapping[str, Any] = field(default_factory=lambda: {"preprocessor_metadata": None})

    @staticmethod
    def from_dict(raw: Mapping[str, Any], *, where: str) -> Ledger:
        """Parses a ledger dict, rejecting missing keys and unknown layouts; ``where`` names the file."""
        for key in ("total_num_rows", "shard_rows"):
            if key not in raw:
                raise ValueError(f"ledger {where} has no {key!r} key (keys: {sorted(raw)})")
        layout = raw.get("layout", CONSOLIDATED)
        if layout not in (CONSOLIDATED, SHARDED):
            raise ValueError(
                f"ledger {where} has layout={layout!r}; expected {CONSOLIDATED!r} or {SHARDED!r}"
            )
        return Ledger(
            total_num_rows=int(raw["total_num_rows"]),
            shard_rows={str(k): int(v) for k, v in raw["shard_rows"].items()},
            is_finished=bool(raw.get("is_finished", False)),
            finished_shards=tuple(str(s) for s in raw.get("finished_shards", ())),
            field_counts={str(k): int(v) for k, v in raw.get("field_counts", {}).items()},
            field_counts_by_shard={
                str(s): {str(k): int(v) for k, v in counts.items()}
                for s, counts in raw.get("field_counts_by_shard", {}).items()
            },
            layout=layout,
            metadata=raw.get("metadata") or {"preprocessor_metadata": None},
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, in Levanter's key order."""
        out = dataclasses.asdict(self)
        out["finished_shards"] = list(self.finished_shards)
        return out


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a sharded ledger: its relative directory, rows and tokens of the read field."""

    name: str
    rows: int
    tokens: int


def read_ledger(root: str, *, context: ts.Context | None = None) -> Ledger:
    """Reads and parses ``<root>/shard_ledger.json``.

    Raises:
        FileNotFoundError: no ledger at ``root``.
        ValueError: the ledger is not valid JSON or lacks required keys.
    """
    kvstore = ts.KvStore.open(kvstore_spec(root), context=context or shared_context()).result()
    found = kvstore.read(LEDGER_FILE_NAME).result()
    where = posixpath.join(root, LEDGER_FILE_NAME)
    if found.state != "value":
        raise FileNotFoundError(
            f"no ledger at {where}: not a token cache, or its writer never committed a row"
        )
    try:
        raw = json.loads(bytes(found.value))
    except json.JSONDecodeError as e:
        raise ValueError(f"ledger {where} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"ledger {where} holds a JSON {type(raw).__name__}, not an object")
    return Ledger.from_dict(raw, where=where)


def try_read_ledger(root: str) -> Ledger | None:
    """``read_ledger``, or None where there is no ledger."""
    try:
        return read_ledger(root)
    except FileNotFoundError:
        return None


def write_ledger(root: str, ledger: Ledger) -> None:
    """Commits ``ledger`` to ``<root>/shard_ledger.json`` atomically and durably (local paths only).

    The JSON goes to a unique temp file that is fsynced, renamed over the ledger, and the directory is
    fsynced, so a crash leaves either the previous ledger or this one, never a torn file.
    """
    if "://" in root:
        raise ValueError(f"ledgers are written to local paths only (got root={root!r})")
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, LEDGER_FILE_NAME)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
    try:
        with open(tmp, "w") as f:
            json.dump(ledger.to_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(root)


def remove_ledger(root: str) -> None:
    """Deletes ``<root>/shard_ledger.json`` (durably) so the cache no longer reads as committed."""
    path = os.path.join(root, LEDGER_FILE_NAME)
    if os.path.exists(path):
        os.unlink(path)
        _fsync_dir(root)


def ledger_metadata(preprocessor_metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Levanter's ledger ``metadata`` dict, normalised through JSON so it compares equal after a reload."""
    meta = dict(preprocessor_metadata) if preprocessor_metadata is not None else None
    return json.loads(json.dumps({"preprocessor_metadata": meta}))


def shard_table(ledger: Ledger, field_name: str) -> list[ShardEntry]:
    """Validates a sharded ledger and returns its finished shards in global row order.

    Raises:
        ValueError: a shard path that is absolute, a URL, empty, escapes with ``..`` or repeats; a
            missing or negative row count; rows not summing to ``total_num_rows``; a non-empty shard
            without a ``field_name`` count; counts for unknown shards; aggregate counts that disagree.
    """
    entries: list[ShardEntry] = []
    seen: set[str] = set()
    for name in ledger.finished_shards:
        if not name or "://" in name or posixpath.isabs(name) or ".." in name.split("/"):
            raise ValueError(f"sharded ledger shard path must be a relative subdirectory (got {name!r})")
        if name in seen:
            raise ValueError(f"sharded ledger lists shard {name!r} twice in finished_shards")
        seen.add(name)
        if name not in ledger.shard_rows:
            raise ValueError(f"sharded ledger has no shard_rows entry (row count) for shard {name!r}")
        rows = ledger.shard_rows[name]
        if rows < 0:
            raise ValueError(f"sharded ledger has negative row count for shard {name!r}: {rows}")
        tokens = ledger.field_counts_by_shard.get(name, {}).get(field_name)
        if tokens is None:
            if rows:
                raise ValueError(
                    f"sharded ledger has no field_counts_by_shard[{name!r}][{field_name!r}] "
                    f"for non-empty shard {name!r} ({rows} rows)"
                )
            tokens = 0
        if tokens < 0:
            raise ValueError(f"sharded ledger has negative {field_name} count for shard {name!r}: {tokens}")
        entries.append(ShardEntry(name, rows, tokens))

    row_sum = sum(e.rows for e in entries)
    if row_sum != ledger.total_num_rows:
        raise ValueError(
            f"sharded ledger row count mismatch: sum of finished shard rows = {row_sum}, "
            f"total_num_rows = {ledger.total_num_rows}"
        )
    unknown = sorted(set(ledger.field_counts_by_shard) - seen)
    if unknown:
        raise ValueError(f"sharded ledger has field_counts_by_shard for unknown shards {unknown}")
    token_sum = sum(e.tokens for e in entries)
    recorded = ledger.field_counts.get(field_name)
    if recorded is not None and recorded != token_sum:
        raise ValueError(
            f"sharded ledger {field_name} count mismatch: sum over shards = {token_sum}, "
            f"field_counts[{field_name!r}] = {recorded}"
        )
    return entries


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
