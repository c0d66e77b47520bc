"""Batches from preblocked rows: segment ids and loss masks read off the ``[DOC]``/``[EOD]`` markers.

A row is one block: documents wrapped in markers, a document longer than the block cut at its
edges, padding only at the tail. Segment ids count the ``[DOC]`` markers up to each position (a
row that opens inside a document starts in segment 0); padding is segment ``-1``, its own. The
loss mask is 1 where the next token is a target of the same document: never on or before
padding, never from an ``[EOD]``, never across a segment change:

    tokens      = [c, E, D, a, b, E, P, P]      (D = [DOC], E = [EOD], P = pad; c continues a doc)
    segment_ids = [0, 0, 1, 1, 1, 1, -1, -1]
    loss_mask   = [1, 0, 1, 1, 1, 0, 0, 0]

``assemble_rows`` builds the same rows from a jagged token cache ("legacy" mode): each row is a few
pieces of documents, each piece a span of one document's slots (slot 0 is its ``[DOC]``, slot
``L + 1`` its ``[EOD]``, slot ``u`` in between its token ``u - 1``); markers are inserted here, the
tokens come from the fetched spans.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from ..batch import Batch
from ..scan import running_count


@partial(jax.jit, static_argnames=("doc_id", "eod_id", "pad_id"))
def block_batch(tokens: Int[Array, "rows block"], *, doc_id: int, eod_id: int, pad_id: int) -> Batch:
    """A ``Batch`` of preblocked rows (see the module docstring).

    Args:
        tokens: ``[rows, block_size]`` token ids (any integer dtype; cast to int32).
        doc_id, eod_id, pad_id: the structural ids (static).

    Returns:
        ``Batch`` with int32 ``tokens``, ``loss_mask`` and ``segment_ids``.
    """
    tokens = tokens.astype(jnp.int32)
    block = tokens.shape[-1]
    is_pad = tokens == pad_id
    segment = jnp.where(is_pad, -1, running_count(tokens == doc_id))
    next_segment = jnp.concatenate([segment[:, 1:], jnp.full_like(segment[:, :1], -1)], axis=1)
    position = jnp.arange(block, dtype=jnp.int32)[None, :]
    loss = (position < block - 1) & ~is_pad & (tokens != eod_id) & (next_segment == segment)
    return Batch(tokens=tokens, loss_mask=loss.astype(jnp.int32), segment_ids=segment)


@partial(jax.jit, static_argnames=("block_size", "doc_id", "eod_id", "pad_id"))
def assemble_rows(
    buffer: Int[Array, " buffer"],
    offsets: Int[Array, "rows pieces"],
    row_start: Int[Array, "rows pieces"],
    slot_start: Int[Array, "rows pieces"],
    slots: Int[Array, "rows pieces"],
    doc_slots: Int[Array, "rows pieces"],
    *,
    block_size: int,
    doc_id: int,
    eod_id: int,
    pad_id: int,
) -> Int[Array, "rows block_size"]:
    """Rows of blocks from pieces of documents and their fetched tokens.

    Pieces of a row are sorted by ``row_start``; unused ones have ``slots == 0`` and come last.

    Args:
        buffer: fetched tokens; piece ``k``'s tokens begin at ``buffer[offsets[:, k]]`` and are the
            document's tokens from ``max(slot_start - 1, 0)`` on.
        offsets: ``int32[rows, pieces]`` where each piece's tokens lie in ``buffer``.
        row_start: ``int32[rows, pieces]`` position of the piece's first slot in the row.
        slot_start: ``int32[rows, pieces]`` the document slot at that position.
        slots: ``int32[rows, pieces]`` slots the piece covers in the row.
        doc_slots: ``int32[rows, pieces]`` the document's ``L + 2`` slots.
        block_size, doc_id, eod_id, pad_id: static.

    Returns:
        ``int32[rows, block_size]`` tokens with markers and padding in place.
    """
    position = jnp.arange(block_size, dtype=jnp.int32)
    used = slots > 0
    # the piece covering each position: the last used piece starting at or before it
    starts_before = (row_start[:, None, :] <= position[None, :, None]) & used[:, None, :]
    piece = jnp.sum(starts_before, axis=2, dtype=jnp.int32) - 1  # [rows, block]
    take = partial(jnp.take_along_axis, indices=jnp.maximum(piece, 0), axis=1)
    start, first, count, size = take(row_start), take(slot_start), take(slots), take(doc_slots)
    covered = (piece >= 0) & (position[None, :] < start + count)
    slot = first + position[None, :] - start
    index = take(offsets) + slot - 1 - jnp.maximum(first - 1, 0)
    content = buffer[jnp.clip(index, 0, buffer.shape[0] - 1)].astype(jnp.int32)
    token = jnp.where(slot == 0, doc_id, jnp.where(slot == size - 1, eod_id, content))
    return jnp.where(covered, token, jnp.int32(pad_id))
