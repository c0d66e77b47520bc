"""Caches built by Levanter's own machinery, read by meshbatch.

A source (Levanter's ``UrlDatasetSourceConfig`` / ``HfDatasetSourceConfig``) becomes a cache
exactly as Levanter makes it: Levanter's tokenizer (``LMTaskConfig.the_tokenizer``: hub names
from the Hugging Face cache, local directories, ``passthrough``), its shard source
(``get_shard_source``: fsspec URLs, brace expansion, ``.gz``/``.zst``, Hugging Face datasets), its
processor (``preprocessor_for_format``: text, chat, supervised; ``enforce_eos``) and its on-disk
format and metadata, so ``TreeCache.load`` (Levanter) and ``TokenCache.open`` (meshbatch) both
read it. Two builders:

* ``in_process`` (the default): Levanter's processor over every shard, written with Levanter's
  ``SerialCacheWriter`` in this process, ``cache_options.batch_size`` rows at a time, with a
  progress log line every ``PROGRESS_EVERY`` documents.
* ``ray``: Levanter's ``build_lm_dataset_cache`` (its Ray cache builder, the distributed engine
  for corpora beyond one machine). Its copy step asks Ray for 4 CPUs and 6 GiB, so on a machine
  with fewer cores it never finishes under Ray's default resources: when no Ray runs, a local one
  is started with ``max(8, cpu_count)`` logical CPUs.

    path = build_split(source, "train", cache_dir="cache/owt", tokenizer=tok, enforce_eos=True)
    # -> "cache/owt/train" (built once; a finished cache is found and reused), or None without data
"""

from __future__ import annotations

import json
import logging
import os
import time

import jax
from levanter.data.passthrough_tokenizer import PassthroughTokenizer
from levanter.data.text import ChatLmDatasetFormat, build_lm_dataset_cache, preprocessor_for_format
from levanter.store.cache import CacheMetadata, CacheOptions, SerialCacheWriter, _canonicalize_batch

from meshbatch.cache.builds import (
    build_once,
    builds_here,
    clear_failure,
    report_failure,
    wait_for_finished,
)
from meshbatch.cache.format.ledger import try_read_ledger

from .observe import CACHE_STATUS

logger = logging.getLogger(__name__)
PROGRESS_EVERY = 10_000  # documents between two progress lines of an in-process build
BUILDERS = ("in_process", "ray")


def source_format(source, chat_template: str | None):
    """The source's format. The installed Levanter (1.2.dev1644) never reads the task's top-level
    ``chat_template``: a chat format naming no template tokenizes with the tokenizer's own. Where
    the top-level one would change that (a chat format naming none), it is refused by name rather
    than tokenizing differently from Levanter for the same YAML."""
    fmt = source.format
    if chat_template is not None and isinstance(fmt, ChatLmDatasetFormat) and fmt.chat_template is None:
        where = "single-turn chat takes no template in Levanter; " if fmt.single_turn else ""
        raise ValueError(
            f"chat_template={chat_template!r:.80} (top level) is not read by the installed Levanter, "
            f"which tokenizes format={fmt!r} with the tokenizer's own template: {where}put the "
            "template in the format (format.chat_template) or drop the top-level chat_template"
        )
    return fmt


def check_metadata(path: str, found, processor_metadata) -> None:
    """Logs a warning, as Levanter does, when the finished cache at ``path`` was written by another
    processor (another tokenizer, ``enforce_eos``, format) than this config's."""
    recorded = found.metadata.get("preprocessor_metadata")
    if recorded != json.loads(json.dumps(processor_metadata)):
        logger.warning(
            "meshbatch: cache %s was built with preprocessor_metadata=%s, not this config's %s: reusing it "
            "(delete it to rebuild)", path, recorded, processor_metadata,
        )  # fmt: skip


def build_split(
    source,
    split: str,
    *,
    cache_dir: str,
    tokenizer,
    enforce_eos: bool = True,
    options: CacheOptions | None = None,
    builder: str = "in_process",
    chat_template: str | None = None,
) -> str | None:
    """Builds (or finds) ``cache_dir/split`` of ``source`` with Levanter's machinery; returns its
    path, or ``None`` when the split has neither data nor a cache."""
    if builder not in BUILDERS:
        raise ValueError(f"cache_builder must be one of {BUILDERS} (got cache_builder={builder!r})")
    options = options or CacheOptions.default()
    fmt = source_format(source, chat_template)
    path = os.path.join(cache_dir, split)
    passthrough = isinstance(tokenizer, PassthroughTokenizer)  # it reads pre-tokenized caches only
    found = try_read_ledger(path)
    if found is not None and found.is_finished:  # Levanter's (or meshbatch's) finished cache
        logger.info("meshbatch: cache %s found (finished, %d documents)", path, found.total_num_rows)
        if not passthrough:
            processor = preprocessor_for_format(fmt, tokenizer, enforce_bos=True, enforce_eos=enforce_eos)
            check_metadata(path, found, processor.metadata)
        CACHE_STATUS.setdefault(path, "found")
        return path
    shards = source.get_shard_source(split)
    if shards is None:
        return None
    if passthrough:
        raise ValueError(
            f"tokenizer='passthrough' reads pre-tokenized caches: {path} holds no finished cache (Levanter's "
            "BatchTokenizer cannot tokenize text with the passthrough tokenizer)"
        )
    if not builds_here():
        logger.info("meshbatch: process %d waits for process 0 to build cache %s", jax.process_index(), path)
        wait_for_finished(path)
        CACHE_STATUS.setdefault(path, "found")
        return path
    processor = preprocessor_for_format(fmt, tokenizer, enforce_bos=True, enforce_eos=enforce_eos)
    metadata = CacheMetadata(preprocessor_metadata=processor.metadata)
    start = time.monotonic()
    logger.info("meshbatch: building cache %s with Levanter's %s builder", path, builder)
    rows: list[int] = []

    def build(target: str) -> None:
        if builder == "ray":
            _ensure_ray()
            cache = build_lm_dataset_cache(
                target, shards, fmt, tokenizer, options, enforce_eos, monitors=False
            )
            cache.await_finished()
            rows.append(len(cache.as_sync_dataset()))
        else:
            with SerialCacheWriter(
                target, processor.output_exemplar, metadata
            ) as writer:  # its ledger at exit
                rows.append(write_rows(writer._tree_store, target, shards, processor, options.batch_size))

    clear_failure(path)
    try:
        ours = build_once(path, build)
    except BaseException as error:
        report_failure(path, error)  # the processes waiting for it raise it too
        raise
    if ours:
        logger.info(
            "meshbatch: cache %s built: %d documents in %.1f s", path, rows[0], time.monotonic() - start
        )
        CACHE_STATUS[path] = "built"
    else:
        CACHE_STATUS.setdefault(path, "found")
    return path


def write_rows(store, path: str, shards, processor, batch_size: int, after_batch=None) -> int:
    """Levanter's ``processor`` over every shard's documents, ``batch_size`` at a time, appended to
    Levanter's ``TreeStore`` ``store`` (at ``path``); ``after_batch(rows, tokens)`` runs after each
    append with the totals so far. Returns the rows written."""
    rows = tokens = 0

    def write(batch: list) -> None:
        nonlocal rows, tokens
        # What Levanter's Ray writer does per batch (its SerialCacheWriter.write_batch assumes
        # rank-1 fields and fails on a supervised cache's per-document sources_len).
        out = processor(batch)
        store.extend_with_batch(store.batch_preparer(_canonicalize_batch(out)))
        rows, tokens = rows + len(batch), tokens + _num_tokens(out)
        if after_batch is not None:
            after_batch(rows, tokens)

    for shard in shards.shard_names:
        batch: list = []
        try:
            for row in shards.open_shard(shard):
                batch.append(row)
                if len(batch) == batch_size:
                    write(batch)
                    batch = []
                    if rows % PROGRESS_EVERY < batch_size:
                        logger.info("meshbatch: building %s: %d documents (shard %s)", path, rows, shard)
            if batch:
                write(batch)
        except Exception as error:  # Levanter's readers name no file: the note does
            url = getattr(shards, "_shard_name_to_url_mapping", {}).get(shard, shard)  # UrlDataSource's
            error.add_note(f"while building {path} from shard {url!r} after {rows} documents")
            raise
    return rows


def _num_tokens(out) -> int:
    if isinstance(out, dict):  # a batch of columns
        return sum(len(ids) for ids in out["input_ids"])
    return sum(len(row["input_ids"]) for row in out)


def _ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        cpus = max(8, os.cpu_count() or 1)
        logger.info("meshbatch: starting a local Ray with %d logical CPUs for Levanter's cache builder", cpus)
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
