"""Splice frames: a span of document tokens placed at offset ``s`` in a ``seq_len`` frame.

Each row copies ``copy_len`` tokens from a flat token buffer, starting at ``src_start``, into
positions ``[s, s + copy_len)`` of an otherwise filler (``pad_token_id``) frame. Loss is on every
copied token that has a copied next token; the segment id flips from 0 to 1 at the splice point,
so document tokens never attend to the filler on their left:

    doc = [0,1,2,3,4], seq_len = 5, content_length = 3, t = 1, s = 2   (P = pad_token_id)
    src_start = offset_of(doc) + t, copy_len = min(3, 5 - 1, 5 - 2) = 3
    tokens      = [P, P, 1, 2, 3]
    loss_mask   = [0, 0, 1, 1, 0]
    segment_ids = [0, 0, 1, 1, 1]

With ``eos_token_id`` the filler token just before the splice becomes EOS
(``tokens = [P, EOS, 1, 2, 3]``), so ``LmExample.causal(..., eos_id=EOS)`` derives the same break.
``segment_mode="isolate"`` also returns the trailing filler to segment 0 (the seed's right-side
filler variant). Cyclic rows (``content_start_mode="cyclic_roll"``) read past the document end
back to its start: ``wrap_after`` tokens are read from ``src_start``, the rest ``wrap_by`` earlier.

The same kernel serves a device-resident pool (``pool_frames``: ``src_start = offsets[doc] + t``)
and a host-fetched buffer (``src_start`` = where the fetched span starts in the buffer). Each row
reads one contiguous ``seq_len`` window of the buffer (a batched ``dynamic_slice``: memcpy-like, no
per-token index math) and iota comparisons mask it; nothing loops over rows. Windows may reach
past the buffer ends, so the buffer is padded by ``seq_len - margin`` on each side; a buffer that
already carries ``margin >= seq_len`` filler tokens at both ends (``DocumentPool(margin=...)``) is
used as is. Cyclic rows gather token by token instead.
"""

from __future__ import annotations

from functools import partial
from typing import Literal, get_args

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from ..batch import Batch
from .splice_rows import sharded_like_rows

SegmentMode = Literal["prefix", "isolate"]


@partial(jax.jit, static_argnames=("seq_len", "pad_token_id", "eos_token_id", "segment_mode", "margin"))
def splice_frames(
    buffer: Int[Array, " buffer"],
    src_start: Int[Array, " batch"],
    s: Int[Array, " batch"],
    copy_len: Int[Array, " batch"],
    *,
    seq_len: int,
    pad_token_id: int,
    eos_token_id: int | None = None,
    segment_mode: SegmentMode = "prefix",
    wrap_after: Int[Array, " batch"] | None = None,
    wrap_by: Int[Array, " batch"] | None = None,
    doc_idx: Int[Array, " batch"] | None = None,
    margin: int = 0,
) -> Batch:
    """Build one splice frame per row from a flat token buffer.

    Args:
        buffer: ``int32[buffer]`` tokens the rows copy from.
        src_start: ``int32[batch]`` buffer position of each row's first copied token.
        s: ``int32[batch]`` frame position of the first copied token, ``0 <= s < seq_len``.
        copy_len: ``int32[batch]`` tokens copied, ``0 <= copy_len <= seq_len - s``.
        eos_token_id: if given, written at ``s - 1`` for rows with ``s > 0`` (static).
        segment_mode: ``"prefix"``: segment 0 on ``[0, s)``, 1 on ``[s, seq_len)``;
            ``"isolate"``: 1 only on ``[s, s + copy_len)`` (static).
        wrap_after: optional ``int32[batch]``; content position ``i >= wrap_after`` reads
            ``src_start + i - wrap_by`` (a cyclic document).
        wrap_by: ``int32[batch]``, required with ``wrap_after``.
        margin: tokens at each end of ``buffer`` that no row copies (static); with
            ``margin >= seq_len`` the buffer is not padded.

    Returns:
        A ``Batch`` of ``int32[batch, seq_len]`` tokens, loss_mask and segment_ids, and ``doc_idx``
        (carried through when given).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1 (got {seq_len=})")
    if segment_mode not in get_args(SegmentMode):
        raise ValueError(f"{segment_mode=} is not one of {get_args(SegmentMode)}")
    if (wrap_after is None) != (wrap_by is None):
        raise ValueError("wrap_after and wrap_by must be given together")
    static = dict(seq_len=seq_len, pad_token_id=pad_token_id, eos_token_id=eos_token_id)
    build = partial(_build, segment_mode=segment_mode, margin=margin, **static)
    return sharded_like_rows(build, src_start, buffer, src_start, s, copy_len, wrap_after, wrap_by, doc_idx)


def _build(
    buffer,
    src_start,
    s,
    copy_len,
    wrap_after,
    wrap_by,
    doc_idx,
    *,
    seq_len: int,
    pad_token_id: int,
    eos_token_id: int | None,
    segment_mode: SegmentMode,
    margin: int,
) -> Batch:
    pos = jax.lax.broadcasted_iota(jnp.int32, (src_start.shape[0], seq_len), 1)
    content = pos - s[:, None]  # index into the copied span
    in_span = (content >= 0) & (content < copy_len[:, None])
    buffer = buffer.astype(jnp.int32)
    if wrap_after is None:
        extra = max(seq_len - margin, 0)
        padded = jnp.pad(buffer, (extra, extra)) if extra else buffer
        window = src_start - s + extra  # buffer position of frame position 0; in range by padding
        copied = jax.vmap(lambda start: jax.lax.dynamic_slice(padded, (start,), (seq_len,)))(window)
    else:
        src = src_start[:, None] + content
        src = jnp.where(content >= wrap_after[:, None], src - wrap_by[:, None], src)
        copied = jnp.take(buffer, src, mode="clip")
    tokens = jnp.where(in_span, copied, jnp.int32(pad_token_id))
    if eos_token_id is not None:
        tokens = jnp.where(pos == s[:, None] - 1, jnp.int32(eos_token_id), tokens)
    loss_mask = (in_span & (content < copy_len[:, None] - 1)).astype(jnp.int32)
    segment = in_span if segment_mode == "isolate" else content >= 0
    return Batch(
        tokens=tokens,
        loss_mask=loss_mask,
        segment_ids=segment.astype(jnp.int32),
        doc_idx=None if doc_idx is None else doc_idx.astype(jnp.int32),
    )


class DocumentPool(eqx.Module):
    """Documents concatenated on device: document ``d`` is ``tokens[offsets[d]:offsets[d + 1]]``
    (built on the host by ``meshbatch.datasets.splice.tables.document_pool``).

    Attributes:
        tokens: ``int32[margin + pool + margin]`` all document tokens, back to back, between
            ``margin`` zeros at each end.
        offsets: ``int32[num_docs + 1]`` document boundaries in ``tokens``, ``offsets[0] == margin``.
        margin: filler tokens at each end (static); ``>= seq_len`` spares ``splice_frames`` a pad.
    """

    tokens: Int[Array, " pool"]
    offsets: Int[Array, " docs_plus_one"]
    margin: int = eqx.field(static=True, default=0)


@partial(jax.jit, static_argnames=("seq_len", "pad_token_id", "eos_token_id", "segment_mode", "cyclic"))
def pool_frames(
    pool: DocumentPool,
    doc: Int[Array, " batch"],
    t: Int[Array, " batch"],
    s: Int[Array, " batch"],
    copy_len: Int[Array, " batch"],
    *,
    seq_len: int,
    pad_token_id: int,
    eos_token_id: int | None = None,
    segment_mode: SegmentMode = "prefix",
    cyclic: bool = False,
) -> Batch:
    """Splice frames for ``(doc, t, s, copy_len)`` rows (a schedule's ``lookup``) of a device-resident
    ``DocumentPool``, with ``doc`` as ``doc_idx``; ``cyclic`` reads past the document end back to its
    start (``cyclic_roll``). The static arguments are ``splice_frames``'.
    """
    doc = doc.astype(jnp.int32)
    src_start, wrap_after, wrap_by = sharded_like_rows(
        partial(_pool_reads, cyclic=cyclic), doc, pool.offsets, doc, t
    )
    return splice_frames(
        pool.tokens,
        src_start,
        s,
        copy_len,
        seq_len=seq_len,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        segment_mode=segment_mode,
        wrap_after=wrap_after,
        wrap_by=wrap_by,
        doc_idx=doc,
        margin=pool.margin,
    )


def _pool_reads(offsets, doc, t, *, cyclic: bool):
    """``src_start`` of each row in the pool, and the wrap of cyclic rows."""
    start = offsets[doc]
    if not cyclic:
        return start + t, None, None
    length = offsets[doc + 1] - start
    return start + t, length - t, length


def cyclic_read_split(
    t: Int[Array, " batch"], copy_len: Int[Array, " batch"], doc_len: Int[Array, " batch"]
) -> tuple[Int[Array, " batch"], Int[Array, " batch"]]:
    """Split a cyclic read into ``[t, t + head)`` and ``[0, tail)`` of the document.

    A host fetch that writes the two pieces back to back needs no ``wrap_after`` in
    ``splice_frames``.
    """
    head = jnp.minimum(copy_len, doc_len - t)
    return head, copy_len - head
