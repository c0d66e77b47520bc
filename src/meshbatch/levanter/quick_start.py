"""Quick start (``quick_start: true``): the train cache read while Levanter's processor writes it.

The build is Levanter's own cache build, made readable as it grows: Levanter's shard source
(``get_shard_source``: fsspec URLs, brace expansion, ``.gz``/``.zst``), its processor
(``preprocessor_for_format``, ``enforce_bos=True`` and the task's ``enforce_eos``) over
``cache_options.batch_size`` documents at a time into Levanter's ``TreeStore`` (``caches.write_rows``,
the code ``cache_builder: in_process`` runs), with Levanter's ledger metadata (the processor's). So
a finished quick-start cache holds exactly what ``in_process`` writes (every field, the same
tokens) and a later run, with or without quick start, reuses it. An unfinished ledger is committed
every ``QUICK_START_FLUSH_TOKENS`` tokens (the first after the first batch); a killed build starts
over (its ledger removed before the builder starts; the wait takes only this build's ``cache_id``).
The builder stops between batches, unfinished, on ``GrowingCache.close`` or as the process ends.
``cache_builder: ray`` is refused (Levanter's Ray build shows no row before it finishes).

Who builds: process 0 of a ``jax.distributed`` run (the others wait for its first commit, bounded by
``MESHBATCH_CACHE_WAIT_S``, read the cache as it grows and raise process 0's reported failure),
and on a local path only the run holding the path's lock (``build_once.quick_start_lock``; a
second run reads the first one's build).

Failures: a build failing before its first commit raises from ``growing_cache``; one failing later
is kept and raised from the returned ``GrowingCache``'s next ``refresh`` (what the pipeline's wait
for more rows calls), so training stops with ``QuickStartBuildError`` naming the cause::

    cache = growing_cache(config, "cache/owt")     # after the first batch is committed
    cache.refresh()                                # 2 Mi tokens committed ... then bad.jsonl:
    cache.refresh()   # QuickStartBuildError: ... cache/owt/train failed ...: JSONDecodeError ...
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
import time
import uuid

from levanter.data.passthrough_tokenizer import PassthroughTokenizer
from levanter.data.text import preprocessor_for_format
from levanter.store.tree_store import TreeStore

from meshbatch.cache import TokenCache
from meshbatch.cache.checksums import sidecar_path
from meshbatch.cache.files import remove_file
from meshbatch.cache.ledger import Ledger, ledger_metadata, remove_ledger, try_read_ledger, write_ledger

from .build_once import (
    builds_here,
    clear_failure,
    is_local,
    quick_start_lock,
    quick_start_running,
    report_failure,
    reported_failure,
    wait_seconds,
)
from .caches import check_metadata, source_format, write_rows

logger = logging.getLogger(__name__)
QUICK_START_FLUSH_TOKENS = 1 << 20  # a quick-start build commits every 1Mi tokens
PROBE_EVERY_S = 5.0  # how often a reader of another run's build checks that run still builds


class QuickStartBuildError(RuntimeError):
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
                f"committed documents: {_describe(error)}"
            ) from (error if isinstance(error, BaseException) else None)
        return super().refresh()


def _describe(error: BaseException | str) -> str:
    if isinstance(error, str):
        return error
    return "; ".join([f"{type(error).__name__}: {error}", *getattr(error, "__notes__", ())])


def growing_cache(config, cache_dir: str | None) -> TokenCache:
    """The train cache of ``config`` (a text ``causal_lm``), open while it is built (see the module
    docstring); a finished cache is opened as is."""
    if cache_dir is None:
        raise ValueError("quick start needs cache_dir")
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
        return _reader(path, lambda: reported_failure(path), why="process 0 builds it")
    lock = quick_start_lock(path) if is_local(path) else None
    if is_local(path) and lock is None:
        return _reader(path, _probe(path), why="another run's quick start builds it")
    try:
        cache = finished()  # another run may have published it before we got the lock
    except BaseException:
        if lock is not None:
            lock.close()
        raise
    if cache is not None:
        if lock is not None:
            lock.close()
        return cache
    failed: list[BaseException] = []
    clear_failure(path)
    # A killed build's leftover goes before the thread starts, and the wait accepts only this
    # build's ledger (its cache_id): a reader never opens arrays the builder is recreating.
    _remove_leftover(path, processor.output_exemplar)
    cache_id, stop = uuid.uuid4().hex, threading.Event()

    def build() -> None:
        try:
            _grow(path, shards, processor, config.cache_options.batch_size, cache_id, stop)
        except _Stopped:
            failed.append(QuickStartBuildError("the build was stopped (the process is ending)"))
            logger.info("meshbatch: quick start: build of %s stopped unfinished", path)
        except BaseException as error:  # raised from the reader's refresh
            failed.append(error)
            logger.exception("quick start: building the train cache %s failed", path)
            report_failure(path, error)  # the other processes reading it raise it too
        finally:
            if lock is not None:
                lock.close()

    # Not a daemon (a daemon thread killed inside TensorStore at exit aborts the process); a
    # process that ends (or a consumer that ``close``s) stops it between batches, unfinished.
    thread = threading.Thread(target=build, name="meshbatch-build", daemon=False)

    def halt() -> None:
        stop.set()
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=STOP_WAIT_S)

    thread.start()
    _at_exit(halt)
    logger.info("meshbatch: quick start: cache %s being built in the background", path)
    try:
        cache = _reader(
            path,
            lambda: failed[0] if failed else None,
            why="the background build writes it",
            accept=lambda ledger: ledger.cache_id == cache_id,
        )
    except BaseException:
        halt()
        raise
    cache.stop = halt
    return cache


class _Stopped(Exception):
    """The build was asked to stop (``GrowingCache.close`` or the process ending)."""


STOP_WAIT_S = 60.0  # how long stopping waits for the batch being written


def _at_exit(hook) -> None:
    """Runs ``hook`` as the interpreter ends, before it joins non-daemon threads (as
    ``concurrent.futures`` does); a plain ``atexit`` hook would run only after the build ended."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - Python < 3.9
        import atexit

        atexit.register(hook)
    else:
        register(hook)


def _remove_leftover(path: str, exemplar) -> None:
    remove_ledger(path)
    for field in exemplar:  # a checksum sidecar of an older meshbatch build no longer applies
        remove_file(sidecar_path(posixpath.join(path, field)))


def _reader(path: str, failure, *, why: str, accept=None) -> GrowingCache:
    """Waits (bounded by ``MESHBATCH_CACHE_WAIT_S``, logging) for ``path``'s first commit (a ledger
    ``accept`` takes, when given); opens it."""
    timeout, start, logged = wait_seconds(), time.monotonic(), time.monotonic()

    def committed() -> bool:
        ledger = try_read_ledger(path)
        return ledger is not None and (accept is None or accept(ledger))

    while not committed():
        error = None if failure is None else failure()
        if error is not None:  # failed before its first commit
            raise QuickStartBuildError(
                f"quick start: building the train cache {path} failed: {_describe(error)}"
            ) from (error if isinstance(error, BaseException) else None)
        now = time.monotonic()
        if now - start > timeout:
            raise TimeoutError(
                f"quick start: no commit of {path} after {now - start:.0f} s ({why}); the bound is "
                f"MESHBATCH_CACHE_WAIT_S={timeout:g}"
            )
        if now - logged > 60:
            logged = now
            logger.info("meshbatch: quick start: waiting for the first commit of %s (%s)", path, why)
        time.sleep(0.02)
    cache = GrowingCache.open(path, require_finished=False)
    cache.failure = failure
    return cache


def _probe(path: str):
    """A ``failure`` for a reader of another run's build: that run released the lock unfinished."""
    last = [time.monotonic()]

    def failure() -> str | None:
        if time.monotonic() - last[0] < PROBE_EVERY_S:
            return None
        last[0] = time.monotonic()
        if quick_start_running(path):
            return None
        ledger = try_read_ledger(path)
        if ledger is not None and ledger.is_finished:
            return None
        return "the run building it stopped before finishing (see its log); a new run builds it again"

    return failure


def _grow(path: str, shards, processor, batch_size: int, cache_id: str, stop: threading.Event) -> None:
    """``in_process``'s build (``caches.write_rows``: same store, same rows), with an unfinished
    ledger (``cache_id``) committed every ``QUICK_START_FLUSH_TOKENS`` tokens and a finished one at
    the end; raises ``_Stopped`` between batches once ``stop`` is set. A killed build starts over:
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
        if stop.is_set():
            raise _Stopped(f"stopped after {rows} documents")
        if tokens - committed[0] >= QUICK_START_FLUSH_TOKENS:
            commit(rows, tokens)

    rows = write_rows(store, path, shards, processor, batch_size, after_batch)
    commit(rows, 0, finished=True)
    logger.info("meshbatch: quick start: cache %s finished: %d documents", path, rows)
