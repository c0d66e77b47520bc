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

A tokenizer that knows ``[DOC]`` as a special token turns the text ``"see [DOC] here"`` into the
structural id, so ``escape_literal_markers`` escapes literal markers in the text first: one
backslash after the bracket of every ``[DOC]``/``[EOD]`` that is already preceded by any number
(zero included) of backslashes, so no literal marker survives, and ``unescape`` removes exactly
that backslash again::

    escape("a[DOC]b")        -> "a[\\DOC]b"
    escape("a[\\DOC]b")      -> "a[\\\\DOC]b"      (already escaped-looking text stays reversible)
    unescape(escape(text))   == text             for every text

Only the marker spellings are touched; every other backslash and bracket is left alone, so the
token distribution of ordinary text does not move.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Any, Literal

import jax
import numpy as np
import tensorstore as ts
from tqdm.auto import tqdm

from meshbatch.arguments import as_key, check_bool, check_choice, check_int, check_token_id
from meshbatch.cache import ByteTokenizer, HFTokenizer, TokenCache, Tokenizer, build_cache
from meshbatch.cache.format.arrays import created
from meshbatch.cache.format.files import (
    directory_exists,
    file_exists,
    remove_directory,
    remove_file,
    write_json_atomic,
)
from meshbatch.cache.format.ledger import Ledger, ledger_metadata, read_ledger, write_ledger
from meshbatch.cache.format.stores import is_url, kvstore_spec

from .block_store import (
    BLOCKS,
    HEADER_FILE,
    REAL_TOKENS,
    Header,
    check_path,
    check_paths,
    check_structural_ids,
    chunk_sums,
    write_header,
    write_sidecar,
)
from .pack_layout import Layout, PackSpec, ShuffleLevel, piece_tokens, plan_layout, ramp

logger = logging.getLogger(__name__)

OutputFormat = Literal["zarr", "npy"]
INCOMPLETE_FILE = ".preblock-incomplete"  # present from the first write until the output is complete
PARTIAL_SUFFIX = ".partial"
REAL_TOKENS_NPY = "real_tokens.npy"
CHUNK_TOKENS = 1 << 18  # tokens per stored chunk (rows of whole blocks)
BATCH_TOKENS = 1 << 22  # tokens assembled per write
_ESCAPE = re.compile(r"\[(\\*)(DOC|EOD)\]")
_UNESCAPE = re.compile(r"\[\\(\\*)(DOC|EOD)\]")


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
        block_size, shuffle_level, rule, buffer_docs: the packing (``PackSpec``).
        key: the shuffle key (an int seed or a JAX key).
        escape_literal_markers: escape literal ``[DOC]``/``[EOD]`` in text before tokenizing
            (module docstring).
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
    given = {"doc_id": doc_id, "eod_id": eod_id, "pad_id": pad_id}
    defaults = {"doc_id": vocab, "eod_id": vocab + 1, "pad_id": vocab + 2, **named}
    markers = {n: check_token_id(n, v) if v is not None else defaults[n] for n, v in given.items()}
    in_vocab = [n for n in named if given[n] is None]  # the tokenizer's own marker tokens
    check_structural_ids(markers, vocab, in_vocab=in_vocab)
    ids = tuple(markers.values())
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
            "tokenizer_markers": in_vocab,
        }
    if cache.num_rows == 0:
        raise ValueError(f"no documents to pack in {inputs}")

    layout = plan_layout(cache.doc_lengths(), spec, key)
    counts = write_blocks(output, cache, layout, ids, vocab, output_format, disable)
    fill = layout.fill()
    header = Header(
        block_size=block_size,
        num_blocks=layout.num_blocks,
        **markers,
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
    if is_url(output):  # an object-store prefix with objects
        holds_anything = directory_exists(output)
    else:  # a file or a non-empty directory
        holds_anything = os.path.exists(output) and (not os.path.isdir(output) or bool(os.listdir(output)))
    if holds_anything:
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


def write_blocks(
    output, cache: TokenCache, layout: Layout, ids, vocab: int, output_format: str, disable
) -> dict:
    """Writes every block of ``layout`` to ``output``; returns ``{"blocks", "literal_markers"}``.

    ``npy`` files are written under hidden names (``.chunk000000.npy.partial``) that no reader
    lists; ``publish_npy`` gives them their names once the header is written.
    """
    S, N = layout.spec.block_size, layout.num_blocks
    chunk_rows = max(1, CHUNK_TOKENS // S)
    batch_rows = chunk_rows * max(1, BATCH_TOKENS // (chunk_rows * S))
    order = layout.by_position()
    first, stop = layout.block_docs(order)
    offsets = cache.doc_offsets()
    real = layout.real_tokens()[layout.block_order]
    store = _create(output, BLOCKS, [N, S], [chunk_rows, S]) if output_format == "zarr" else None
    literal, pending, sums = 0, None, []
    with tqdm(total=N, desc=f"writing {output}", unit="block", disable=disable) as bar:
        for p0 in range(0, N, batch_rows):
            p1 = min(N, p0 + batch_rows)
            rows, found = assemble(cache, layout, order, first, stop, offsets, p0, p1, ids, vocab)
            literal += found
            if pending is not None:
                pending.result()
            if store is not None:
                pending = store[p0:p1].write(rows)
                sums += chunk_sums(np.asarray(rows, np.int32), chunk_rows)  # whole chunks but the last
            else:
                for c0 in range(p0, p1, chunk_rows):
                    name = f"chunk{c0 // chunk_rows:06d}.npy"
                    _save_hidden(output, name, rows[c0 - p0 : min(p1, c0 + chunk_rows) - p0])
            bar.update(p1 - p0)
    if pending is not None:
        pending.result()
    if store is not None:
        _create(output, REAL_TOKENS, [N], [max(1, CHUNK_TOKENS)])[:].write(real).result()
        write_sidecar(
            output,
            blocks=N,
            block_size=S,
            chunk_rows=chunk_rows,
            real_chunk=CHUNK_TOKENS,
            data=sums,
            real=chunk_sums(np.asarray(real, np.int32), CHUNK_TOKENS),
        )
    else:
        _save_hidden(output, REAL_TOKENS_NPY, real)
    return {"blocks": N, "literal_markers": literal}


def _hidden(name: str) -> str:
    return f".{name}{PARTIAL_SUFFIX}"


def _save_hidden(output: str, name: str, array: np.ndarray) -> None:
    with open(os.path.join(output, _hidden(name)), "wb") as f:
        np.save(f, array)


def publish_npy(output: str) -> None:
    """Renames the hidden ``npy`` files of ``write_blocks`` to their names: ``real_tokens.npy`` first,
    then the chunks in order (a kill between two renames leaves fewer chunk rows than the header
    says: a named error when opened, never a silently short dataset)."""
    hidden = sorted(n for n in os.listdir(output) if n.startswith(".chunk") and n.endswith(PARTIAL_SUFFIX))
    for name in [_hidden(REAL_TOKENS_NPY), *hidden]:
        os.replace(os.path.join(output, name), os.path.join(output, name[1 : -len(PARTIAL_SUFFIX)]))


def _create(root: str, name: str, shape: list[int], chunks: list[int]) -> ts.TensorStore:
    # crc32c after compression: TensorStore checks every chunk as it reads it (Levanter never
    # reads block stores, so its codec list need not match)
    codecs = [
        {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle"}},
        {"name": "crc32c"},
    ]
    spec = {
        "driver": "zarr3",
        "kvstore": kvstore_spec(os.path.join(root, name)),
        "store_data_equal_to_fill_value": True,  # every chunk stored: a missing one is missing data
        "metadata": {
            "shape": shape,
            "data_type": "int32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "codecs": codecs,
        },
    }
    return created(spec)


def assemble(cache, layout: Layout, order, first, stop, offsets, p0: int, p1: int, ids, vocab: int):
    """Output blocks ``[p0, p1)`` as ``int32[p1 - p0, block_size]``, and how many document tokens
    equal a structural id. Every piece of every document in those blocks is read in one coalesced
    read and scattered into place with numpy (no Python loop over documents).
    """
    S = layout.spec.block_size
    doc_id, eod_id, pad_id = ids
    packed = layout.block_order[p0:p1]
    counts = stop[packed] - first[packed]
    row = np.repeat(np.arange(p1 - p0), counts)
    index = np.repeat(first[packed], counts) + ramp(counts)
    doc = order[index]
    start, size = layout.starts[doc], layout.sizes[doc]
    block_lo = packed[row] * S
    lo, hi = np.maximum(start, block_lo), np.minimum(start + size, block_lo + S)
    slot_lo, slots = lo - start, hi - lo
    token_lo, token_count = piece_tokens(slot_lo, slots, size)
    read = cache.read_runs(offsets[doc] + token_lo, token_count)
    buffer = read.buffer
    structural = np.isin(buffer, ids)
    outside = ((buffer < 0) | (buffer >= vocab)) & ~structural
    if outside.any():
        raise ValueError(f"cache {cache.path} holds token id {int(buffer[outside][0])} outside [0, {vocab=})")

    piece = np.repeat(np.arange(doc.shape[0]), slots)
    step = ramp(slots)
    slot = slot_lo[piece] + step
    where = row[piece] * S + (lo - block_lo)[piece] + step
    at = np.clip(read.span_starts[piece] + slot - 1 - token_lo[piece], 0, max(buffer.shape[0] - 1, 0))
    content = buffer[at] if buffer.size else np.zeros_like(slot)
    values = np.where(slot == 0, doc_id, np.where(slot == size[piece] - 1, eod_id, content))
    out = np.full((p1 - p0) * S, pad_id, np.int32)
    out[where] = values
    return out.reshape(p1 - p0, S), int(structural.sum())


def escape(text: str) -> str:
    """``text`` with no literal ``[DOC]``/``[EOD]`` left (see the module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (got text={text!r})")
    return _ESCAPE.sub(r"[\\\1\2]", text)


def unescape(text: str) -> str:
    """The inverse of ``escape``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (got text={text!r})")
    return _UNESCAPE.sub(r"[\1\2]", text)


class EscapingTokenizer:
    """A tokenizer that escapes literal markers before encoding (and unescapes after decoding)."""

    def __init__(self, inner: Tokenizer):
        self.inner = inner

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return self.inner.encode_batch([escape(t) for t in texts])

    def decode(self, ids: Sequence[int]) -> str:
        return unescape(self.inner.decode(ids))

    def metadata(self) -> dict[str, Any]:
        return {**self.inner.metadata(), "escape_literal_markers": True}
