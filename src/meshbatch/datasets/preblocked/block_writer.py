"""Writing preblocked data: documents -> ``[DOC] ... [EOD]`` blocks, planned on device, copied here.

    preblock("/data/blocks", ["a.jsonl", "b.txt"], block_size=128)            # text, byte tokens
    preblock("/data/blocks", ["/data/cache"], block_size=128, vocab_size=50257)  # a token cache

Text inputs are tokenized first into ``<output>/tokens`` (a Levanter token cache, kept: the legacy
dataset mode reads it, and a new block size or shuffle needs no second tokenization). From the
cache's offsets alone ``plan_layout`` (the jitted packing plan) decides where every document goes;
the writer then only copies: per batch of output blocks it reads the documents' token spans
coalesced and scatters them, with the markers, into place. Marker ids default to ``vocab_size``,
``vocab_size + 1`` and ``vocab_size + 2`` (``[DOC]``, ``[EOD]``, pad), or to a Hugging Face
tokenizer's own ``[DOC]``/``[EOD]``/``[PAD]`` tokens when it has them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Literal

import jax
import numpy as np

from meshbatch.arguments import as_key, check_bool, check_choice, check_int, check_token_id
from meshbatch.cache import ByteTokenizer, HFTokenizer, TokenCache, Tokenizer, build_cache
from meshbatch.cache.format.files import (
    directory_exists,
    file_exists,
    remove_directory,
    remove_file,
    write_json_atomic,
)
from meshbatch.cache.format.ledger import Ledger, ledger_metadata, read_ledger, write_ledger
from meshbatch.cache.format.stores import is_url

from .assemble import publish_npy, write_blocks
from .block_store import (
    BLOCKS,
    HEADER_FILE,
    Header,
    check_path,
    check_paths,
    check_structural_ids,
    write_header,
)
from .escape import EscapingTokenizer
from .pack_layout import SHUFFLE_LEVELS, PackSpec, ShuffleLevel, plan_layout

logger = logging.getLogger(__name__)

OutputFormat = Literal["zarr", "npy"]
INCOMPLETE_FILE = ".preblock-incomplete"  # present from the first write until the output is complete


def preblock(
    output: str,
    inputs: Sequence[str],
    *,
    block_size: int,
    shuffle_level: ShuffleLevel = "document",
    key=0,
    rule: str = "ffd",
    buffer_docs: int = 1024,
    escape_literal_markers: bool = False,
    tokenizer: Tokenizer | None = None,
    doc_id: int | None = None,
    eod_id: int | None = None,
    pad_id: int | None = None,
    vocab_size: int | None = None,
    text_key: str = "text",
    text_docs: str = "file",
    output_format: OutputFormat = "zarr",
    if_exists: Literal["error", "overwrite"] = "error",
    progress: bool | None = None,
) -> Header:
    """Writes preblocked data to ``output`` (see the module docstring); returns its header.

    Args:
        output: the directory to write: a local path, or a ``gs://`` / ``s3://`` URL (zarr only).
        inputs: ``.txt``/``.jsonl`` files (optionally ``.gz``), or one Levanter token cache directory
            (local or at a URL).
        block_size: tokens per block.
        shuffle_level: ``"none"``, ``"document"`` (default) or ``"segment"`` (``layout`` module).
        key: the shuffle key (an int seed or a JAX key).
        rule: ``"ffd"`` (buffered first-fit decreasing, default) or ``"greedy"``.
        buffer_docs: documents grouped per buffer with ``"ffd"``.
        escape_literal_markers: escape literal ``[DOC]``/``[EOD]`` in text before tokenizing.
        tokenizer: for text inputs; default UTF-8 bytes without an end-of-document token.
        doc_id, eod_id, pad_id: the structural ids (defaults: see the module docstring).
        vocab_size: ordinary ids are ``[0, vocab_size)``; default: the tokenizer's (text) or, for a
            cache, the byte tokenizer's when the cache's ledger says it was built with it.
        text_key, text_docs: how text inputs are read (``meshbatch.cache.build_cache``).
        output_format: ``"zarr"`` (a TensorStore store) or ``"npy"`` (``chunk*.npy`` files).
        if_exists: ``"error"`` or ``"overwrite"`` (only a directory holding a preblock header).
        progress: show progress bars; ``None``: only on a terminal.

    Raises:
        ValueError: a bad argument (named), mixed inputs, a cache token outside the vocabulary.
        FileExistsError: ``output`` exists and ``if_exists="error"``.
    """
    spec = PackSpec(block_size, shuffle_level=shuffle_level, rule=rule, buffer_docs=buffer_docs)
    check_choice("shuffle_level", shuffle_level, SHUFFLE_LEVELS)
    check_choice("output_format", output_format, ("zarr", "npy"))
    check_choice("if_exists", if_exists, ("error", "overwrite"))
    check_bool("escape_literal_markers", escape_literal_markers)
    output = check_path("output", output)
    if progress is not None:
        check_bool("progress", progress)
    key = as_key(key)
    if isinstance(inputs, str | os.PathLike):
        raise TypeError(f"inputs must be a list of paths (got inputs={inputs!r})")
    inputs = check_paths("inputs", inputs)
    if not inputs:
        raise ValueError("inputs must name at least one file or cache directory (got inputs=[])")
    disable = None if progress is None else not progress
    if output_format == "npy" and is_url(output):
        raise ValueError(f"output_format='npy' writes local .npy files; output={output} needs 'zarr'")
    from_cache = any(is_url(p) or os.path.isdir(p) for p in inputs)  # text inputs are local files
    if from_cache:
        if len(inputs) != 1:
            raise ValueError(f"a token cache directory must be the only input (got inputs={inputs})")
        if escape_literal_markers:
            raise ValueError("escape_literal_markers applies to text inputs; a token cache is tokenized")
        if tokenizer is not None:
            raise ValueError("tokenizer applies to text inputs, not to a token cache")
        if _inside(inputs[0], output):
            raise ValueError(f"the input cache {inputs[0]} lies inside output={output}; write elsewhere")
        vocab = vocab_size if vocab_size is not None else _cache_vocab(inputs[0])
        named = {}
    else:
        tokenizer = tokenizer or ByteTokenizer(add_eos=False)
        named = _named_markers(tokenizer)
        vocab = vocab_size if vocab_size is not None else tokenizer.vocab_size
    vocab = check_int("vocab_size", vocab, low=1, high=2**31 - 1)
    given_ids = {
        n: v for n, v in (("doc_id", doc_id), ("eod_id", eod_id), ("pad_id", pad_id)) if v is not None
    }
    ids = _marker_ids(doc_id, eod_id, pad_id, vocab, named)
    _prepare_output(output, if_exists)

    if from_cache:
        cache = TokenCache.open(inputs[0])
        source = {"kind": "cache", "path": inputs[0] if is_url(inputs[0]) else os.path.abspath(inputs[0])}
    else:
        tokens_root = os.path.join(output, "tokens")
        encoder = EscapingTokenizer(tokenizer) if escape_literal_markers else tokenizer
        build_cache(
            tokens_root,
            inputs,
            tokenizer=encoder,
            text_key=text_key,
            text_docs=text_docs,
            if_exists="overwrite",
            progress=progress,
        )
        cache = TokenCache.open(tokens_root)
        source = {
            "kind": "text",
            "inputs": [os.path.abspath(p) for p in inputs],
            "tokenizer": encoder.metadata(),
            "tokenizer_markers": [n for n in named if n not in given_ids],
        }
    if cache.num_rows == 0:
        raise ValueError(f"no documents to pack in {inputs}")

    layout = plan_layout(cache.doc_lengths(), spec, key)
    counts = write_blocks(output, cache, layout, ids, vocab, output_format, disable)
    fill = layout.fill()
    header = Header(
        block_size=block_size,
        num_blocks=layout.num_blocks,
        doc_id=ids[0],
        eod_id=ids[1],
        pad_id=ids[2],
        vocab_size=vocab,
        shuffle_level=shuffle_level,
        key_data=np.asarray(jax.random.key_data(key)).reshape(-1).tolist(),
        rule=rule,
        buffer_docs=buffer_docs,
        escape_literal_markers=escape_literal_markers,
        source=source,
        counts={
            "documents": layout.num_docs,
            "tokens": int(cache.num_tokens),
            **counts,
            "split_documents": int(fill.pop("split_documents")),
            "pad_slots": int(fill.pop("pad_slots")),
        },
        fill=fill,
    )
    write_header(output, header)
    if output_format == "npy":
        publish_npy(output)
    if output_format == "zarr":  # committed last: an interrupted write never reads as a store
        n = layout.num_blocks
        write_ledger(
            output,
            Ledger(
                n, {"": n}, True, ("",), {BLOCKS: n * block_size}, metadata=ledger_metadata(header.to_dict())
            ),
        )
    remove_file(os.path.join(output, INCOMPLETE_FILE))  # the last step: the output is complete
    if counts["literal_markers"]:
        logger.warning(
            "%d tokens inside documents equal a structural id (doc/eod/pad = %s); they are structural "
            "now (escape_literal_markers escapes literal text)",
            counts["literal_markers"],
            ids,
        )
    logger.info(
        "wrote %d blocks of %d to %s (fill %.4f)", layout.num_blocks, block_size, output, fill["fill"]
    )
    return header


def _prepare_output(output: str, if_exists: str) -> None:
    """Empties ``output`` (a local directory or an object-store prefix) for writing and marks it
    incomplete until ``preblock`` finishes.

    An output still marked incomplete (a killed run) is rebuilt whatever ``if_exists`` says: it
    holds nothing but a partial write of ours.
    """
    if file_exists(os.path.join(output, INCOMPLETE_FILE)):
        logger.warning("%s holds an interrupted preblock run; rebuilding it", output)
        remove_directory(output)
    if _holds_anything(output):
        if if_exists == "error":
            raise FileExistsError(f"{output} exists; pass if_exists='overwrite' to replace it")
        if not file_exists(os.path.join(output, HEADER_FILE)):
            raise FileExistsError(f"{output} exists and holds no {HEADER_FILE}: refusing to overwrite it")
        remove_directory(output)
    if not is_url(output):
        os.makedirs(output, exist_ok=True)
    write_json_atomic(
        os.path.join(output, INCOMPLETE_FILE), {"writer": "meshbatch.preblock", "pid": os.getpid()}
    )


def _holds_anything(path: str) -> bool:
    """A local path that is a file or a non-empty directory; an object-store prefix with objects."""
    if is_url(path):
        return directory_exists(path)
    return os.path.exists(path) and (not os.path.isdir(path) or bool(os.listdir(path)))


def _inside(path: str, root: str) -> bool:
    """Whether ``path`` lies inside (or is) ``root``: local paths or URLs."""
    if is_url(path) or is_url(root):
        return (path.rstrip("/") + "/").startswith(root.rstrip("/") + "/")
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(root)]) == os.path.abspath(root)


def _cache_vocab(path: str) -> int:
    meta = (read_ledger(path).metadata or {}).get("preprocessor_metadata") or {}
    if (meta.get("tokenizer") or {}).get("tokenizer") == "byte":
        return ByteTokenizer().vocab_size
    raise ValueError(f"the vocabulary of cache {path} is unknown: pass vocab_size")


def _named_markers(tokenizer: Tokenizer) -> dict[str, int]:
    if not isinstance(tokenizer, HFTokenizer):
        return {}
    found = {
        name: tokenizer._tokenizer.token_to_id(text)
        for name, text in (("doc_id", "[DOC]"), ("eod_id", "[EOD]"), ("pad_id", "[PAD]"))
    }
    return {name: i for name, i in found.items() if i is not None}


def _marker_ids(doc_id, eod_id, pad_id, vocab: int, named: dict[str, int]) -> tuple[int, int, int]:
    defaults = {"doc_id": vocab, "eod_id": vocab + 1, "pad_id": vocab + 2, **named}
    given = {"doc_id": doc_id, "eod_id": eod_id, "pad_id": pad_id}
    ids = {n: check_token_id(n, v) if v is not None else defaults[n] for n, v in given.items()}
    in_vocab = [n for n in named if given[n] is None]  # the tokenizer's own marker tokens
    check_structural_ids(ids, vocab, in_vocab=in_vocab)
    return ids["doc_id"], ids["eod_id"], ids["pad_id"]
