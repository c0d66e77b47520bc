"""Assembling preblocked blocks: each batch of output blocks read coalesced and scattered into place.

``write_blocks`` writes a planned ``Layout``'s blocks (zarr store or ``chunk*.npy``) and their
real-token counts; ``assemble`` builds one batch of blocks from the cache's token spans.
"""

from __future__ import annotations

import os

import numpy as np
import tensorstore as ts
from tqdm.auto import tqdm

from meshbatch.cache import TokenCache
from meshbatch.cache.format.arrays import created, kvstore_spec

from .block_store import BLOCKS, REAL_TOKENS, chunk_sums, write_sidecar
from .pack_layout import Layout

PARTIAL_SUFFIX = ".partial"
REAL_TOKENS_NPY = "real_tokens.npy"
CHUNK_TOKENS = 1 << 18  # tokens per stored chunk (rows of whole blocks)
BATCH_TOKENS = 1 << 22  # tokens assembled per write


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
    token_lo = np.maximum(slot_lo - 1, 0)
    token_count = np.maximum(np.minimum(slot_lo + slots - 1, size - 2) - token_lo, 0)
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


def ramp(counts: np.ndarray) -> np.ndarray:
    """``[0, 1, .., counts[0] - 1, 0, 1, .., counts[1] - 1, ...]``."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
