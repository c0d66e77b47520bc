"""Noticing a cache that changed under an open reader, for the price of one conditional read.

A ``TokenCache`` remembers the ledger it loaded and that file's stamp (``LedgerFile``). After every
batch of reads that goes to storage it asks for the ledger only if the stamp moved (a ``stat`` on
a local disk, a conditional read on an object store). A moved ledger is parsed and compared with
the loaded one::

    loaded {cache_id: a1, rows: 10, finished: false}, now {cache_id: a1, rows: 12}   grew: fine
    loaded {cache_id: a1, ...},                        now {cache_id: b7, ...}        replaced
    loaded {rows: 10, finished: true},                 now {rows: 10, finished: false} replaced
    loaded {rows: 10},                                 now: no ledger                  being overwritten

Only the first line is served; the others raise ``CacheChangedError`` naming the cache and what
changed. A sharded cache's reader also watches the ledger of every shard it reads, as read before
its first read of that shard (at open, all in one round of concurrent reads, ``shard_ledgers``; a
lazily opened cache when it first touches the shard, ``read_shard_ledgers``): a shard directory
replaced under it (a new ``cache_id``, or a rewritten or missing shard ledger) is a
``CacheChangedError`` naming the shard, though the top-level ledger never changed. A batch of reads
checks the shards it read (``LedgerWatch.start``): one ``stat`` per shard read on a local disk (a
conditional read elsewhere).

Writers commit the ledger last and an overwrite removes it first, so a read whose check
passes read the cache its reader loaded. A read served whole from a ``BlockCache`` reads nothing
now: its blocks were read, checked and verified when they were read, and are rows of the ledger
the reader loaded, so it costs no check (at 200 caches in object storage, that check was 200
requests a step, the only ones a warm block cache makes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

import tensorstore as ts

from meshbatch.cache.format.checks import CacheChangedError
from meshbatch.cache.format.ledger import (
    LEDGER_FILE_NAME,
    SHARDED,
    Ledger,
    LedgerFile,
    shard_root,
    shard_table,
)
from meshbatch.cache.format.stores import kvstore_spec, result


def ledger_change(loaded: Ledger, now: Ledger) -> str | None:
    """Why ``now`` is not ``loaded`` grown by more committed rows, or None if it is."""
    if loaded.cache_id is not None and now.cache_id != loaded.cache_id:
        return f"it was replaced (cache_id {loaded.cache_id} -> {now.cache_id})"
    if now.layout != loaded.layout:
        return f"its layout changed {loaded.layout!r} -> {now.layout!r}"
    if now.metadata != loaded.metadata:
        return f"its preprocessor metadata changed {dict(loaded.metadata)} -> {dict(now.metadata)}"
    if now.total_num_rows < loaded.total_num_rows:
        return f"it shrank from {loaded.total_num_rows} to {now.total_num_rows} committed rows"
    if loaded.is_finished and now != loaded:
        return (
            f"its finished ledger was rewritten ({loaded.total_num_rows} rows, {dict(loaded.field_counts)} "
            f"-> {now.total_num_rows} rows, {dict(now.field_counts)}, is_finished={now.is_finished})"
        )
    if now.finished_shards[: len(loaded.finished_shards)] != loaded.finished_shards:
        return f"its finished shards changed {list(loaded.finished_shards)} -> {list(now.finished_shards)}"
    return None


ShardFiles = dict[str, tuple[LedgerFile, Ledger, object]]


LEDGER_READ_CONCURRENCY = 256  # object-store requests in flight while the shard ledgers are read


def shard_ledgers(
    root: str, ledger: Ledger, field: str, context: ts.Context, *, skip: Collection[str] = ()
) -> ShardFiles:
    """The ledger file, ledger and stamp of every finished shard of a sharded ``ledger`` (read before
    its rows are loaded, so a replacement after the load changes the stamp). The shard table is
    checked first (``shard_table``, ``shard_root``): no shard path leaves ``root``, by name or symlink.
    """
    if ledger.layout != SHARDED:
        return {}
    names = [entry.name for entry in shard_table(ledger, field, root=root) if entry.name not in skip]
    return read_shard_ledgers(root, names, context)


def read_shard_ledgers(root: str, names: Collection[str], context: ts.Context) -> ShardFiles:
    """The ledger file, ledger and stamp of each shard in ``names`` (from a checked shard table).

    Every ledger is read in one round of concurrent requests through one kvstore at ``root`` (up to
    ``LEDGER_READ_CONCURRENCY`` in flight on an object store): reading a thousand shard ledgers
    waits about as long as reading a few, not a thousand one after another.
    """
    names = list(names)
    if not names:
        return {}
    roots = [shard_root(root, name) for name in names]  # before any read: no path leaves the root
    wide = ts.Context(
        {
            "gcs_request_concurrency": {"limit": LEDGER_READ_CONCURRENCY},
            "s3_request_concurrency": {"limit": LEDGER_READ_CONCURRENCY},
        },
        context,
    )
    store = result(ts.KvStore.open(kvstore_spec(root), context=wide), what=f"opening {root}")
    files = [
        LedgerFile(shard, kvstore=store, key=f"{name}/{LEDGER_FILE_NAME}")
        for name, shard in zip(names, roots, strict=True)
    ]
    pending = [file.start_read() for file in files]  # all issued before any is awaited
    return {name: (file, *finish()) for name, file, finish in zip(names, files, pending, strict=True)}


def _unchanged() -> None:
    """The completed check of a local ledger whose ``stat`` had not moved."""


def start_watches(watched: list[tuple[LedgerWatch, Collection[str]]]) -> Callable[[], None]:
    """``watch.start(shards)`` of each ``(watch, shards)``, all started before any is completed
    (one read plan's caches). A local ledger with no shard to check is its one ``stat``, compared
    here: no function per cache for the common case."""
    pending = []
    for watch, shards in watched:
        if shards or not watch.file.unchanged_on_disk(watch.stamp):
            pending.append(watch.start(shards))
    if not pending:
        return _unchanged

    def complete() -> None:
        for done in pending:
            done()

    return complete


class LedgerWatch:
    """The ledger a reader loaded, and the check that it is still the cache's ledger."""

    def __init__(self, file: LedgerFile, loaded: Ledger, stamp: object, shards: ShardFiles | None = None):
        self.file, self.loaded, self._stamp = file, loaded, stamp
        self._shards = dict(shards or {})
        self._lock = threading.Lock()

    @property
    def stamp(self) -> object:
        """The stamp of the ledger last loaded (``LedgerFile``)."""
        return self._stamp

    @property
    def shard_names(self) -> set[str]:
        with self._lock:
            return set(self._shards)

    def add_shards(self, shards: ShardFiles) -> None:
        """Watches shards loaded since (``refresh``)."""
        with self._lock:
            for name, entry in shards.items():
                self._shards.setdefault(name, entry)

    def update(self, loaded: Ledger, stamp: object) -> None:
        """Records a ledger the reader has loaded since (``refresh``)."""
        with self._lock:
            self.loaded, self._stamp = loaded, stamp

    def raise_if_replaced(self, now: Ledger) -> None:
        reason = ledger_change(self.loaded, now)
        if reason is not None:
            raise CacheChangedError(f"cache {self.file.root} changed under an open reader: {reason}")

    def start(self, shards: Collection[str] | None = None) -> Callable[[], None]:
        """Starts the check (a ``stat``, or a conditional read); the returned function completes it.

        Args:
            shards: the shards whose ledgers are checked too (those a read touched); ``None``: all.
        """
        with self._lock:
            stamp = self._stamp
            if shards is None:
                shards = list(self._shards.items())
            else:
                shards = [(name, self._shards[name]) for name in shards if name in self._shards]
        if not shards and self.file.unchanged_on_disk(stamp):  # the common case, a stat and no more
            return _unchanged
        answer = self.file.changed(stamp)
        shard_answers = [(name, loaded, file.changed(stamp)) for name, (file, loaded, stamp) in shards]

        def complete() -> None:
            changed, ledger, new_stamp = answer()
            if changed:
                if ledger is None:
                    raise CacheChangedError(
                        f"cache {self.file.root} changed under an open reader: its ledger {self.file.where} "
                        "is gone (the cache is being overwritten or was deleted)"
                    )
                self.raise_if_replaced(ledger)
                with self._lock:  # it only grew: later checks compare against the newer file
                    if self._stamp == stamp:
                        self._stamp = new_stamp
            for name, loaded, shard_answer in shard_answers:
                changed, ledger, _ = shard_answer()
                if not changed or ledger == loaded:  # a store may answer unchanged content in full
                    continue
                reason = "its ledger is gone" if ledger is None else ledger_change(loaded, ledger)
                reason = reason or "its ledger was rewritten"
                raise CacheChangedError(
                    f"cache {self.file.root} changed under an open reader: shard {name!r} was replaced "
                    f"({reason})"
                )

        return complete
