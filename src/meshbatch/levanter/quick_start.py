"""Quick start (``quick_start: true``): the train cache read while Levanter's processor writes it.

The build is Levanter's own cache build, made readable as it grows: Levanter's shard source
(``get_shard_source``: fsspec URLs, brace expansion, ``.gz``/``.zst``), its processor
(``preprocessor_for_format``, ``enforce_bos=True`` and the task's ``enforce_eos``) over
``cache_options.batch_size`` documents at a time into Levanter's ``TreeStore`` (``caches.write_rows``,
the code ``cache_builder: in_process`` runs), with Levanter's ledger metadata (the processor's). So
a finished quick-start cache holds exactly what ``in_process`` writes (every field, the same
tokens) and a later run, with or without quick start, reuses it. An unfinished ledger is committed
every ``QUICK_START_FLUSH_TOKENS`` tokens (the first after the first batch); a killed build starts
over (its ledger removed before the builder starts). The builder stops between batches,
unfinished, on ``GrowingCache.close`` or as the process ends (its main thread has ended).
``cache_builder: ray`` is refused (Levanter's Ray build shows no row before it finishes).

Who builds: process 0 of a ``jax.distributed`` run, and on a local path only the run holding the
path's lock (``build_news.quick_start_lock``). The others read its build as it grows: the build
announces its ``cache_id`` (``build_news``) and every reader, this process's included, waits
(``poll_until``) for a ledger of that build, or a finished one, before it opens any row, so a
killed build's leftover is never read.

Failures: a build failing (or stopped) before its first commit raises from ``growing_cache``; one
failing later is kept, reported to the other processes and runs (``build_news.release``), and
raised from every reader's next ``refresh`` (what the pipeline's wait for more rows calls), so
training stops with ``QuickStartBuildError`` (a ``CacheBuildFailed``) naming the cause::

    cache = growing_cache(config, "cache/owt")     # after the first batch is committed
    cache.refresh()                                # 2 Mi tokens committed ... then bad.jsonl:
    cache.refresh()   # QuickStartBuildError: ... cache/owt/train failed ...: JSONDecodeError ...
"""

from __future__ import annotations

import logging
import os
import threading
import uuid

from levanter.data.passthrough_tokenizer import PassthroughTokenizer
from levanter.data.text import preprocessor_for_format
from levanter.store.tree_store import TreeStore

from meshbatch.cache import TokenCache, poll_until
from meshbatch.cache.builds import (
    CacheBuildFailed,
    LocalNews,
    OwnNews,
    RemoteNews,
    announce,
    builds_here,
    clear_failure,
    describe,
    is_local,
    quick_start_lock,
    release,
    take_lock,
)
from meshbatch.cache.format.ledger import (
    Ledger,
    ledger_metadata,
    try_read_ledger,
    write_ledger,
)
from meshbatch.cache.write.writer import remove_commit

from .caches import check_metadata, source_format, write_rows

logger = logging.getLogger(__name__)
QUICK_START_FLUSH_TOKENS = 1 << 20  # a quick-start build commits every 1Mi tokens


class QuickStartBuildError(CacheBuildFailed):
    """The background build of a quick-start cache failed (or its builder stopped)."""


class GrowingCache(TokenCache):
    """A ``TokenCache`` of a cache still being written whose ``refresh`` raises the build's failure."""

    failure = None  # () -> BaseException | str | None: why the build stopped unfinished, else None
    stop = None  # () -> None: stops this process's background build (between batches), if any

    def close(self) -> None:
        """Stops this process's background build, unfinished (a later run builds it again)."""
        if self.stop is not None:
            self.stop()

    def refresh(self) -> int:
        error = None if self.failure is None else self.failure()
        if error is not None and not self.is_finished:
            raise QuickStartBuildError(
                f"quick start: building the train cache {self.path} failed after {self.num_rows} "
                f"committed documents: {describe(error)}"
            ) from (error if isinstance(error, BaseException) else None)
        return super().refresh()


def growing_cache(config, cache_dir: str) -> TokenCache:
    """The train cache of ``config`` (a text ``causal_lm``), open while it is built (see the module
    docstring); a finished cache is opened as is."""
    path = os.path.join(cache_dir, "train")
    fmt, tokenizer = source_format(config, config.chat_template), config.the_tokenizer
    if isinstance(tokenizer, PassthroughTokenizer):
        raise ValueError(f"quick_start=true tokenizes text: tokenizer={config.tokenizer!r} cannot")
    processor = preprocessor_for_format(fmt, tokenizer, enforce_bos=True, enforce_eos=config.enforce_eos)

    def finished() -> TokenCache | None:
        """The cache at ``path`` if it is finished (checked against this config's processor)."""
        done = try_read_ledger(path)
        if done is None or not done.is_finished:
            return None
        check_metadata(path, done, processor.metadata)
        return TokenCache.open(path)

    if (cache := finished()) is not None:
        return cache
    if config.cache_builder != "in_process":
        raise ValueError(
            f"quick_start=true grows the cache in this process: cache_builder={config.cache_builder!r} "
            "(Levanter's Ray build shows no row before it finishes); use cache_builder: in_process"
        )
    shards = config.get_shard_source("train")
    if shards is None:
        raise ValueError(f"quick start builds the train cache: give train_urls (got {config.train_urls!r})")
    if "input_ids" not in processor.output_exemplar:
        raise ValueError(f"quick_start=true needs a text format (got format={config.format!r})")
    if not builds_here():
        return _reader(path, RemoteNews(path), why="process 0 builds it")
    cache_id = uuid.uuid4().hex
    lock = take_lock(path, cache_id, quick_start_lock) if is_local(path) else None
    if is_local(path) and lock is None:
        news = LocalNews(path)
        cache = _reader(path, news, why="another run's quick start builds it")
        news.accepted = cache.ledger.cache_id
        announce(path, cache.ledger.cache_id)  # the other processes of this run read that build too
        return cache
    try:
        cache = finished()  # another run may have published it before we got the lock
    except BaseException:
        release(path, lock, cache_id, None)
        raise
    if cache is not None:
        release(path, lock, cache_id, None)
        return cache
    failed: list[BaseException] = []
    try:
        clear_failure(path)
        remove_commit(path, processor.output_exemplar)  # a killed build's; no reader opens it
        announce(path, cache_id)
    except BaseException as error:  # the readers hear of it, and the lock goes
        release(path, lock, cache_id, error)
        raise
    stop = threading.Event()

    def build() -> None:
        error = None
        try:
            _grow(path, shards, processor, config.cache_options.batch_size, cache_id, stop)
        except _Stopped:
            error = QuickStartBuildError(
                "the build was stopped (its cache was closed, or the process is ending)"
            )
            logger.info("meshbatch: quick start: build of %s stopped unfinished", path)
        except BaseException as raised:  # raised from every reader's refresh
            error = raised
            logger.exception("quick start: building the train cache %s failed", path)
        finally:
            if error is not None:
                failed.append(error)
            release(path, lock, cache_id, error)

    # Not a daemon (a daemon thread killed inside TensorStore at exit aborts the process); a
    # process that ends (or a consumer that ``close``s) stops it between batches, unfinished.
    thread = threading.Thread(target=build, name="meshbatch-build", daemon=False)

    def halt() -> None:
        stop.set()
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=STOP_WAIT_S)

    thread.start()
    logger.info("meshbatch: quick start: cache %s being built in the background", path)
    try:
        cache = _reader(path, OwnNews(cache_id, failed), why="the background build writes it")
    except BaseException:
        halt()
        raise
    cache.stop = halt
    return cache


class _Stopped(Exception):
    """The build was asked to stop (``GrowingCache.close`` or the process ending)."""


STOP_WAIT_S = 60.0  # how long stopping waits for the batch being written


def _reader(path: str, news, *, why: str) -> GrowingCache:
    """Waits (``poll_until``) for a ledger of the build ``news`` names (its ``cache_id``), or a
    finished one, and opens it: never a killed build's leftover, whose arrays its builder is
    recreating. Raises the build's failure (``news.failure``) as ``QuickStartBuildError``."""
    seen: list[Ledger | None] = [None]

    def ours(ledger: Ledger | None) -> bool:
        return ledger is not None and (ledger.is_finished or ledger.cache_id == news.cache_id())

    def opened() -> GrowingCache | None:
        seen[0] = try_read_ledger(path)
        if not ours(seen[0]):
            return None
        cache = GrowingCache.open(path, require_finished=False)
        return cache if ours(cache.ledger) else None

    def status() -> str:
        if seen[0] is None:
            return "has no commit (no ledger)"
        return (
            f"has no commit of this build (a ledger of build {seen[0].cache_id}: a killed build's leftover)"
        )

    def failure() -> QuickStartBuildError | None:
        error = news.failure()
        if error is None:
            return None
        failed = QuickStartBuildError(
            f"quick start: building the train cache {path} failed: {describe(error)}"
        )
        failed.__cause__ = error if isinstance(error, BaseException) else None
        return failed

    cache = poll_until(opened, path=path, status=status, why=why, failure=failure)
    cache.failure = news.failure
    return cache


def _grow(path: str, shards, processor, batch_size: int, cache_id: str, stop: threading.Event) -> None:
    """``in_process``'s build (``caches.write_rows``: same store, same rows), with an unfinished
    ledger (``cache_id``) committed every ``QUICK_START_FLUSH_TOKENS`` tokens and a finished one at
    the end; raises ``_Stopped`` between batches once ``stop`` is set or the main thread has
    ended (the process is exiting). A killed build starts over:
    ``growing_cache`` removed its ledger, here its arrays are recreated."""
    exemplar = processor.output_exemplar
    store = TreeStore.open(exemplar, path, mode="w", cache_metadata=True)
    metadata = ledger_metadata(processor.metadata)
    committed = [-QUICK_START_FLUSH_TOKENS]  # the first batch commits (TokenCache needs a row)

    def commit(rows: int, tokens: int, finished: bool = False) -> None:
        done = ("",) if finished else ()
        ledger = Ledger(rows, {"": rows}, finished, done, metadata=metadata, cache_id=cache_id)
        write_ledger(path, ledger)
        committed[0] = tokens

    def after_batch(rows: int, tokens: int) -> None:
        # The interpreter ends the main thread before it joins this one: a public sign of exit.
        if stop.is_set() or not threading.main_thread().is_alive():
            raise _Stopped(f"stopped after {rows} documents")
        if tokens - committed[0] >= QUICK_START_FLUSH_TOKENS:
            commit(rows, tokens)

    rows = write_rows(store, path, shards, processor, batch_size, after_batch)
    commit(rows, 0, finished=True)
    logger.info("meshbatch: quick start: cache %s finished: %d documents", path, rows)
