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

Ledgers are read and written through TensorStore's kvstore at object-store URLs (one PUT each) and
written locally by an atomic temp-file + fsync + rename, so a reader sees the old ledger or the new one.
Every value is type-checked on read: ``"total_num_rows": null`` or ``"is_finished": "yes"`` is a
``CacheIntegrityError`` naming the file and key, never a crash or a truthy guess.

``shard_table`` checks a sharded ledger's table and gives its finished shards in global row order
(above: ``[ShardEntry("part-0", rows=2, tokens=7), ShardEntry("part-1", rows=3, tokens=9)]``).
A shard name is a relative path of plain names (``check_relative_path``, as ``write_shard`` takes
it), so two names never spell one directory: ``"./p0"``, ``"p0/"`` and ``".//p0"`` are refused.
``shard_root`` joins a name to the cache root and refuses a local shard directory that a symlink
leads out of the root (``check_inside``); ``check_distinct_shards`` refuses two names that
symlinks resolve to one directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import tensorstore as ts

from meshbatch.cache.format.checks import CacheIntegrityError, check_relative_path
from meshbatch.cache.format.files import remove_file, write_json_atomic
from meshbatch.cache.format.stores import check_inside, kvstore_spec, local_path, result, shared_context

logger = logging.getLogger(__name__)

LEDGER_FILE_NAME = "shard_ledger.json"
CONSOLIDATED = "consolidated"
SHARDED = "sharded"
Layout = Literal["consolidated", "sharded"]


@dataclass(frozen=True)
class Ledger:
    """The parsed ``shard_ledger.json``; field names and JSON keys are Levanter's ``CacheLedger``'s.

    ``cache_id`` is meshbatch's own key (Levanter ignores it): a random id a writer draws when it
    creates a cache and keeps when it resumes one, so a reader can tell a cache that grew from one
    that was replaced. Caches written by Levanter have none.

    ``meshbatch_checksums`` (meshbatch's too; written only when true) says the part was written by
    ``CacheWriter``, which commits the checksum sidecar before every ledger: a reader then refuses the
    part without its sidecar (deleted checksums), where a cache without the key (Levanter's, a quick
    start's, or one an older meshbatch wrote) is read without checksums when it has no sidecar.
    """

    total_num_rows: int
    shard_rows: Mapping[str, int]
    is_finished: bool = False
    finished_shards: tuple[str, ...] = ()
    field_counts: Mapping[str, int] = field(default_factory=dict)
    field_counts_by_shard: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    layout: Layout = CONSOLIDATED
    metadata: Mapping[str, Any] = field(default_factory=lambda: {"preprocessor_metadata": None})
    cache_id: str | None = None
    meshbatch_checksums: bool = False

    @staticmethod
    def from_dict(raw: Mapping[str, Any], *, where: str) -> Ledger:
        """Parses a ledger dict, refusing missing keys, wrong JSON types and unknown layouts.

        Raises:
            CacheIntegrityError: naming ``where`` (the file), the key and the value found.
        """
        for key in ("total_num_rows", "shard_rows"):
            if key not in raw:
                raise CacheIntegrityError(f"ledger {where} has no {key!r} key (keys: {sorted(raw)})")
        layout = raw.get("layout", CONSOLIDATED)
        if layout not in (CONSOLIDATED, SHARDED):
            raise CacheIntegrityError(
                f"ledger {where} has layout={layout!r}; expected {CONSOLIDATED!r} or {SHARDED!r}"
            )
        is_finished = raw.get("is_finished", False)
        if not isinstance(is_finished, bool):
            raise CacheIntegrityError(
                f"ledger {where}: is_finished must be true or false (got {is_finished!r})"
            )
        metadata = raw.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise CacheIntegrityError(f"ledger {where}: metadata must be an object (got {metadata!r})")
        cache_id = raw.get("cache_id")
        if cache_id is not None and not isinstance(cache_id, str):
            raise CacheIntegrityError(f"ledger {where}: cache_id must be a string (got {cache_id!r})")
        checksums = raw.get("meshbatch_checksums", False)
        if not isinstance(checksums, bool):
            raise CacheIntegrityError(
                f"ledger {where}: meshbatch_checksums must be true or false (got {checksums!r})"
            )
        shards = raw.get("finished_shards", [])
        if not isinstance(shards, list) or not all(isinstance(s, str) for s in shards):
            raise CacheIntegrityError(
                f"ledger {where}: finished_shards must be a list of strings (got {shards!r})"
            )
        by_shard = _json_object(raw.get("field_counts_by_shard", {}), "field_counts_by_shard", where)
        return Ledger(
            total_num_rows=_count(raw["total_num_rows"], "total_num_rows", where),
            shard_rows=_counts(raw["shard_rows"], "shard_rows", where),
            is_finished=is_finished,
            finished_shards=tuple(shards),
            field_counts=_counts(raw.get("field_counts", {}), "field_counts", where),
            field_counts_by_shard={
                s: _counts(counts, f"field_counts_by_shard[{s!r}]", where) for s, counts in by_shard.items()
            },
            layout=layout,
            metadata=metadata or {"preprocessor_metadata": None},
            cache_id=cache_id,
            meshbatch_checksums=checksums,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, in Levanter's key order (``cache_id`` only when there is one,
        ``meshbatch_checksums`` only when true)."""
        out = dataclasses.asdict(self)
        out["finished_shards"] = list(self.finished_shards)
        if self.cache_id is None:
            del out["cache_id"]
        if not self.meshbatch_checksums:
            del out["meshbatch_checksums"]
        return out


def _json_object(value, key: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise CacheIntegrityError(f"ledger {where}: {key} must be an object (got {key}={value!r})")
    return value


def _count(value, key: str, where: str) -> int:
    """A JSON count: an integer >= 0 (not a bool, a float, a string or null)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CacheIntegrityError(f"ledger {where}: {key} must be an integer >= 0 (got {key}={value!r})")
    return value


def _counts(value, key: str, where: str) -> dict[str, int]:
    return {name: _count(v, f"{key}[{name!r}]", where) for name, v in _json_object(value, key, where).items()}


class LedgerFile:
    """The ledger file of one cache, read with a *stamp* that changes whenever the file does.

    On a local disk the stamp is the file's ``stat`` (device, inode, size, mtime in ns), taken just
    before the read, so it is never newer than the content read; elsewhere it is TensorStore's
    storage generation. ``changed(stamp)`` costs a ``stat`` locally and a conditional
    read that transfers nothing while the file is unchanged on an object store: how an open
    ``TokenCache`` notices, after every batch of reads, that its cache was replaced.
    """

    def __init__(
        self,
        root: str,
        *,
        context: ts.Context | None = None,
        kvstore: ts.KvStore | None = None,
        key: str = LEDGER_FILE_NAME,
    ):
        """``kvstore`` and ``key``: the file as ``key`` of an already open kvstore (the shards of a
        sharded cache share their root's: ``"part-0/shard_ledger.json"``), instead of opening one."""
        self.root = root
        self.where = posixpath.join(root, LEDGER_FILE_NAME)
        self._key = key
        if kvstore is None:
            kvstore = result(
                ts.KvStore.open(kvstore_spec(root), context=context or shared_context()),
                what=f"opening {root}",
            )
        self._kvstore = kvstore
        local = local_path(root)
        self._local = None if local is None else os.path.join(os.path.abspath(local), LEDGER_FILE_NAME)

    def read(self) -> tuple[Ledger, object]:
        """The ledger and its stamp.

        Raises:
            FileNotFoundError: no ledger at ``root``.
            CacheIntegrityError: the ledger is not valid JSON or not a valid ledger.
        """
        return self.start_read()()

    def start_read(self) -> Callable[[], tuple[Ledger, object]]:
        """Issues the read of ``read`` and returns the function that waits for it and parses it, so
        many ledgers are read in one round of concurrent requests (``watch.shard_ledgers``)."""
        stamp = self._stat()
        future = self._kvstore.read(self._key)

        def finish() -> tuple[Ledger, object]:
            found = result(future, what=f"reading {self.where}")
            if found.state != "value":
                raise FileNotFoundError(
                    f"no ledger at {self.where}: not a token cache, or its writer never committed a row"
                )
            return self.parse(bytes(found.value)), found.stamp.generation if stamp is None else stamp

        return finish

    def changed(self, stamp) -> Callable[[], tuple[bool, Ledger | None, object]]:
        """Starts finding out whether the file still has ``stamp``; the returned function answers.

        The answer is ``(changed, ledger, stamp)``: ``(False, None, stamp)`` while unchanged,
        ``(True, None, None)`` when the file is gone, else the current ledger and its stamp.
        """
        if self._local is None:
            future = self._kvstore.read(self._key, if_not_equal=stamp)

            def answer():
                found = result(future, what=f"checking {self.where}")
                if found.state == "unspecified":
                    return False, None, stamp
                if found.state == "missing":
                    return True, None, None
                return True, self.parse(bytes(found.value)), found.stamp.generation

            return answer
        now = self._stat()

        def answer_local():
            if now == stamp:
                return False, None, stamp
            try:
                return (True, *self.read())
            except FileNotFoundError:
                return True, None, None

        return answer_local

    def unchanged_on_disk(self, stamp) -> bool:
        """Whether the file is on a local disk and its ``stat`` is still ``stamp`` (``changed``'s
        answer when it is ``(False, None, stamp)``, without the function that gives it)."""
        return self._local is not None and self._stat() == stamp

    def parse(self, raw_bytes: bytes) -> Ledger:
        try:
            raw = json.loads(raw_bytes)
        except (ValueError, RecursionError) as e:  # bad JSON or UTF-8, a >4300-digit integer, deep nesting
            problem = f"{type(e).__name__}: {e}"
            raise CacheIntegrityError(f"ledger {self.where} is not valid JSON: {problem}") from e
        if not isinstance(raw, dict):
            raise CacheIntegrityError(f"ledger {self.where} holds a JSON {type(raw).__name__}, not an object")
        return Ledger.from_dict(raw, where=self.where)

    def _stat(self) -> tuple[int, int, int, int] | None:
        if self._local is None:
            return None
        try:
            st = os.stat(self._local)
        except FileNotFoundError:
            return (0, 0, -1, 0)  # no file: differs from every file's stamp
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_ledger(root: str, *, context: ts.Context | None = None) -> Ledger:
    """Reads and parses ``<root>/shard_ledger.json`` (raising as ``LedgerFile.read``)."""
    return LedgerFile(root, context=context).read()[0]


def try_read_ledger(root: str) -> Ledger | None:
    """``read_ledger``, or None where there is no ledger."""
    try:
        return read_ledger(root)
    except FileNotFoundError:
        return None


def write_ledger(root: str, ledger: Ledger) -> None:
    """Commits ``ledger`` to ``<root>/shard_ledger.json`` atomically and durably (local or object store)."""
    write_json_atomic(posixpath.join(root, LEDGER_FILE_NAME), ledger.to_dict())


def remove_ledger(root: str) -> None:
    """Deletes ``<root>/shard_ledger.json`` (durably) so the cache no longer reads as committed."""
    remove_file(posixpath.join(root, LEDGER_FILE_NAME))


def ledger_metadata(preprocessor_metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Levanter's ledger ``metadata`` dict, normalised through JSON so it compares equal after a reload."""
    meta = dict(preprocessor_metadata) if preprocessor_metadata is not None else None
    return json.loads(json.dumps({"preprocessor_metadata": meta}))


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a sharded ledger: its relative directory, rows and tokens of the read field."""

    name: str
    rows: int
    tokens: int


def shard_table(ledger: Ledger, field_name: str, *, root: str | None = None) -> list[ShardEntry]:
    """Validates a sharded ledger (of the cache at ``root``, named in messages) and returns its
    finished shards in global row order.

    Raises:
        CacheIntegrityError: a shard path that is absolute, a URL, empty, has a ``.``, ``..`` or empty
            part (``"./p0"``, ``"p0/"``, ``"a//b"``) or repeats; a missing or negative row count; rows
            not summing to ``total_num_rows``; a non-empty shard without a ``field_name`` count;
            counts for unknown shards; aggregate counts that disagree.
    """
    sharded = f"sharded ledger {posixpath.join(root, LEDGER_FILE_NAME)}" if root else "sharded ledger"
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
