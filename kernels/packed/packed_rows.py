"""The build of packed rows: tokens, loss mask, segment ids and attention metadata from the
fetched spans of each row's examples.

A row holds up to ``max_segments`` examples back to back (``length`` tokens each, 0 for an unused
slot), then padding. Span slot ``j`` of a row holds example ``j``'s tokens, and, for chat data,
slot ``max_segments + j`` its ``assistant_masks``. Per position ``t`` of a row: the example ``j``
it belongs to (the number of examples that end at or before ``t``), its position ``p`` within
that example's kept tokens, and from those every leaf:

    tokens       content[offsets[j] + p]; pad_id past the last example
    segment_ids  the example's cache row (Levanter's segment ids: the global example index); -1 on padding
    positions    p (restarting at each example); 0 on padding            (attention metadata)
    cu_seqlens   [0, end_0, end_1, ...]: each example's end, the row's real tokens repeated past
                 the last example                                        (attention metadata)

The loss mask (1 where position ``t``'s next token is a target) has two rules:

* ``levanter`` (bit for bit as Levanter's packed chat and supervised datasets): chat
  ``mask[t] = assistant_masks[t + 1]`` over the whole row (so an example's last token takes the
  next example's first mask value); supervised ``mask[t] = (p >= sources_len)``; the row's last
  position is always 0; without prompt masking every position but the row's last is 1 (padding too).
* ``meshbatch`` (the default): ``mask[t] = 1`` iff ``t`` is not its example's last token and the
  token after it is supervised: chat ``assistant_masks[t + 1] != 0``, supervised
  ``cut + p + 1 >= sources_len`` (``cut``: tokens dropped from the example's start); without prompt
  masking every token but each example's last. Padding is 0.

    seq_len 8, chat examples [a b c] masks [0 1 1], [d e] masks [0 1]
    tokens      a b c d e 0 0 0          segment_ids  r r r s s -1 -1 -1
    positions   0 1 2 0 1 0 0 0          cu_seqlens   [0 3 5 5 ...]
    meshbatch   1 1 0 1 0 0 0 0          levanter     1 1 0 1 0 0 0 0
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

LOSS_RULES: tuple[str, ...] = ("meshbatch", "levanter")
LossRule = Literal["meshbatch", "levanter"]


class PackedRows(eqx.Module):
    """What ``packed_rows`` builds, ``[rows, seq_len]`` int32 each (``cu_seqlens``:
    ``[rows, max_segments + 1]``)."""

    tokens: Int[Array, "rows seq"]
    loss_mask: Int[Array, "rows seq"]
    segment_ids: Int[Array, "rows seq"]
    positions: Int[Array, "rows seq"]
    cu_seqlens: Int[Array, "rows segs1"]


@partial(jax.jit, static_argnames=("seq_len", "chat", "mask_prompt", "rule", "pad_id"))
def packed_rows(
    tokens: Int[Array, " buffer"],
    offsets: Int[Array, "rows spans"],
    member: Int[Array, "rows segs"],
    length: Int[Array, "rows segs"],
    cut: Int[Array, "rows segs"],
    sources_len: Int[Array, "rows segs"] | None,
    *,
    seq_len: int,
    chat: bool,
    mask_prompt: bool,
    rule: LossRule,
    pad_id: int,
) -> PackedRows:
    """Builds packed rows from one flat fetched buffer (see the module docstring).

    Args:
        tokens: the fetched buffer (token spans; for chat, the mask spans too).
        offsets: ``int32[rows, spans]`` where each span starts in ``tokens``: ``segs`` token spans,
            then (chat) ``segs`` mask spans.
        member: ``int32[rows, segs]`` each slot's example (its cache row); any value for an unused slot.
        length: ``int32[rows, segs]`` kept tokens of each slot's example, 0 for an unused slot;
            used slots first, at most ``seq_len`` together.
        cut: ``int32[rows, segs]`` tokens dropped from the start of each example (right slicing).
        sources_len: ``int32[rows, segs]`` prompt tokens of each example (supervised), or ``None`` (chat).
        seq_len: tokens per row.
        chat: the mask spans follow the token spans (chat data) or not (supervised).
        mask_prompt: train on assistant / completion tokens only (Levanter's ``mask_user_turns``,
            ``mask_inputs``).
        rule: ``"meshbatch"`` or ``"levanter"`` (see the module docstring).
        pad_id: the token of padding positions.
    """
    if rule not in LOSS_RULES:
        raise ValueError(f"rule={rule!r} is not one of {LOSS_RULES}")
    if not chat and mask_prompt and sources_len is None:
        raise ValueError("supervised rows with mask_prompt need sources_len")
    rows, segs = length.shape
    t = jnp.arange(seq_len, dtype=jnp.int32)[None, :]
    ends = jnp.cumsum(length, axis=1, dtype=jnp.int32)
    starts = ends - length
    total = ends[:, -1:]
    # the slot of position t: how many examples end at or before t (ends == seq_len dropped)
    marks = jnp.zeros((rows, seq_len), jnp.int32)
    marks = marks.at[jnp.arange(rows)[:, None], ends].add(1, mode="drop")
    slot = jnp.minimum(jnp.cumsum(marks, axis=1, dtype=jnp.int32), segs - 1)
    valid = t < total
    take = lambda table: jnp.take_along_axis(table, slot, axis=1)  # noqa: E731  [rows, segs] -> [rows, seq]
    p = jnp.where(valid, t - take(starts), 0)
    own_length = take(length)
    index = jnp.where(valid, take(offsets[:, :segs]) + p, 0)
    out_tokens = jnp.where(valid, jnp.take(tokens, index), pad_id)
    segment_ids = jnp.where(valid, take(member), -1)
    has_next = valid & (p + 1 < own_length)  # the next position is the same example's
    last_position = t == seq_len - 1
    if chat:
        mask_index = jnp.where(valid, take(offsets[:, segs:]) + p, 0)
        assistant = jnp.where(valid, jnp.take(tokens, mask_index), 0)
        next_assistant = jnp.concatenate([assistant[:, 1:], jnp.zeros((rows, 1), jnp.int32)], axis=1)
    if rule == "levanter":
        if not mask_prompt:
            loss = jnp.broadcast_to(~last_position, valid.shape)
        elif chat:
            loss = (next_assistant != 0) & ~last_position
        else:
            loss = valid & (p >= take(sources_len)) & ~last_position
    elif not mask_prompt:
        loss = has_next
    elif chat:
        loss = has_next & (next_assistant != 0)
    else:
        loss = has_next & (take(cut) + p + 1 >= take(sources_len))
    cu_seqlens = jnp.concatenate([jnp.zeros((rows, 1), jnp.int32), ends], axis=1)
    return PackedRows(
        tokens=out_tokens.astype(jnp.int32),
        loss_mask=loss.astype(jnp.int32),
        segment_ids=segment_ids.astype(jnp.int32),
        positions=p.astype(jnp.int32),
        cu_seqlens=cu_seqlens,
    )
