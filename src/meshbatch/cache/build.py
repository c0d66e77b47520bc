"""Building a token cache from text and JSONL files: read, tokenize, write, resumably.

Documents come from the inputs in order: a ``.jsonl`` line is one document (its ``text_key`` field);
a text file is one document, or one per non-empty line with ``text_docs="line"``. ``.gz`` files are
decompressed. Run twice, the build resumes: documents the ledger already commits are read but not
tokenized again::

    build_cache("/data/cache", ["a.jsonl", "b.txt"])    # killed after 1200 documents
    build_cache("/data/cache", ["a.jsonl", "b.txt"])    # skips 1200, writes the rest, finishes
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Iterator, Sequence
from typing import IO, Literal

import numpy as np
from tqdm.auto import tqdm

from .ledger import Ledger, ledger_metadata, try_read_ledger
from .tokenizers import ByteTokenizer, Tokenizer
from .writer import DEFAULT_FLUSH_TOKENS, CacheWriter, IfExists

logger = logging.getLogger(__name__)

TextDocs = Literal["file", "line"]


def iter_documents(
    paths: Sequence[str], *, text_key: str = "text", text_docs: TextDocs = "file"
) -> Iterator[str]:
    """Yields the documents of ``paths`` in order (see the module docstring).

    Raises:
        ValueError: a JSONL line that is not a JSON object with a string ``text_key`` (named by file
            and line number), or an unknown ``text_docs``.
    """
    if text_docs not in ("file", "line"):
        raise ValueError(f"text_docs must be 'file' or 'line' (got {text_docs=})")
    for path in paths:
        with _open_text(path) as f:
            if _is_jsonl(path):
                for lineno, line in enumerate(f, start=1):
                    if line.strip():
                        yield _jsonl_text(line, text_key, where=f"{path}:{lineno}")
            elif text_docs == "file":
                yield f.read()
            else:
                yield from (line.rstrip("\r\n") for line in f if line.strip())


def build_cache(
    output: str,
    inputs: Sequence[str],
    *,
    tokenizer: Tokenizer | None = None,
    field: str = "input_ids",
    dtype: np.dtype | str = "int32",
    text_key: str = "text",
    text_docs: TextDocs = "file",
    if_exists: IfExists = "resume",
    batch_docs: int = 256,
    flush_tokens: int = DEFAULT_FLUSH_TOKENS,
    progress: bool | None = None,
) -> Ledger:
    """Tokenizes ``inputs`` into a finished cache at ``output``.

    Args:
        output: cache root (local path).
        inputs: text / JSONL files (optionally ``.gz``), read in this order.
        tokenizer: defaults to ``ByteTokenizer()``.
        field: the field written.
        dtype: token dtype on disk; every id of the tokenizer's vocabulary must fit.
        text_key: the JSONL field holding a document's text.
        text_docs: a text file is one document (``"file"``) or one per non-empty line (``"line"``).
        if_exists: ``"resume"`` (default: continue a killed build of the same inputs and tokenizer;
            a finished one is returned as is), ``"error"`` or ``"overwrite"``.
        batch_docs: documents tokenized per call.
        flush_tokens: tokens per commit.
        progress: show a tqdm bar; ``None`` shows it only on a terminal.

    Returns:
        The finished ledger.
    """
    tokenizer = tokenizer or ByteTokenizer()
    if np.iinfo(np.dtype(dtype)).max < tokenizer.vocab_size - 1:
        raise ValueError(f"dtype={np.dtype(dtype)} cannot hold token ids up to {tokenizer.vocab_size - 1}")
    missing = [p for p in inputs if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"input files not found: {missing}")
    metadata = {
        "tokenizer": tokenizer.metadata(),
        "inputs": [{"path": os.path.abspath(p), "bytes": os.path.getsize(p)} for p in inputs],
        "text_key": text_key,
        "text_docs": text_docs,
    }
    if if_exists == "resume":
        done = try_read_ledger(output)
        if done is not None and done.is_finished and dict(done.metadata) == ledger_metadata(metadata):
            logger.info("cache %s is already built (%d rows)", output, done.total_num_rows)
            return done

    with CacheWriter(
        output, field=field, dtype=dtype, if_exists=if_exists, metadata=metadata, flush_tokens=flush_tokens
    ) as writer:
        skip = writer.num_rows
        if skip:
            logger.info("resuming %s after %d committed documents", output, skip)
        batch: list[str] = []
        disable = None if progress is None else not progress  # tqdm: None = off unless a terminal
        bar = tqdm(desc=f"building {output}", unit="doc", initial=skip, disable=disable)
        for i, text in enumerate(iter_documents(inputs, text_key=text_key, text_docs=text_docs)):
            if i < skip:
                continue
            batch.append(text)
            if len(batch) == batch_docs:
                writer.write(tokenizer.encode_batch(batch))
                bar.update(len(batch))
                batch = []
        if batch:
            writer.write(tokenizer.encode_batch(batch))
            bar.update(len(batch))
        bar.close()
        return writer.finish()


def _is_jsonl(path: str) -> bool:
    return path.removesuffix(".gz").endswith((".jsonl", ".ndjson"))


def _open_text(path: str) -> IO[str]:
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _jsonl_text(line: str, text_key: str, *, where: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from e
    if not isinstance(record, dict) or not isinstance(record.get(text_key), str):
        raise ValueError(f"{where}: expected a JSON object with a string {text_key!r} field")
    return record[text_key]
