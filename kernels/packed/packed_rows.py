"""Packed rows of variable-length examples: the packing plan (which examples share a row, in
what order) and the build of the packed rows.

Each example has a size in slots (its token count, at most ``seq_len`` after truncation), and a row
holds at most ``seq_len`` slots and ``max_segments`` examples. Two rules:

``greedy`` (Levanter's ``pack_documents``, bit for bit): examples in the order given; an example
joins the current row if the row's tokens plus its own stay within ``seq_len`` and the row holds
fewer than ``max_segments`` examples, otherwise it opens the next row. An example longer than
``seq_len`` (``long``, counted whole) always sits alone: nothing joins a row that is over.

``first_fit`` (the default): examples are taken ``window`` at a time, in the order given; within a
window each goes into the first row of that window with room for it (free slots and a free segment
slot), a new row when none has. ``decreasing=True`` takes a window's examples largest first (ties in
the given order): first-fit decreasing. A window's rows follow the previous window's.

    seq_len = 8, max_segments = 4, sizes [6, 5, 2, 3]
    greedy                 rows [0, 1, 1, 2]          [6] [5 2] [3]    -> 3 rows, fill 16/24
    first_fit (window 4)   rows [0, 1, 0, 1]          [6 2] [5 3]      -> 2 rows, fill 16/16

``pack_tables`` turns the row of each example into the tables a plan reads: ``members`` (example
indices grouped by row, in the order they joined it) and ``row_start`` (where each row's members
begin). Work is int32; ``greedy`` is one ``lax.scan`` over the examples, ``first_fit`` one scan of
``window`` steps over all windows at once (O(window) per example).

The build (``packed_rows``): a row holds up to ``max_segments`` examples back to back (``length``
tokens each, 0 for an unused slot), then padding. Span slot ``j`` of a row holds example ``j``'s
tokens, and, for chat data, slot ``max_segments + j`` its ``assistant_masks``. Per position ``t``
of a row: the example ``j`` it belongs to (the number of examples that end at or before ``t``), its
position ``p`` within that example's kept tokens, and from those every leaf:

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


class PackTables(eqx.Module):
    """The rows a packing made.

    Attributes:
        members: ``int32[n]`` example indices, grouped by row (row 0's first), each row's in the
            order they joined it.
        row_start: ``int32[n + 1]`` row ``r``'s members are ``members[row_start[r]:row_start[r + 1]]``;
            entries past ``num_rows`` equal ``n``.
        num_rows: ``int32[]`` rows the packing fills.
    """

    members: Int[Array, " n"]
    row_start: Int[Array, " n1"]
    num_rows: Int[Array, ""]


@partial(jax.jit, static_argnames=("max_segments",))
def greedy_rows(sizes: Int[Array, " n"], seq_len: Int[Array, ""], *, max_segments: int) -> Int[Array, " n"]:
    """``int32[n]``: the row of each example under Levanter's greedy rule (``sizes``: tokens per
    example, untruncated; ``seq_len`` an int32 scalar, so every row length shares a compilation)."""

    def step(carry, size):
        row, used, count = carry
        fresh = (count == 0) | (used + size > seq_len) | (count >= max_segments)
        row = jnp.where(fresh & (count > 0), row + 1, row)
        used = jnp.where(fresh, size, used + size)
        count = jnp.where(fresh, 1, count + 1)
        return (row, used, count), row

    init = (jnp.int32(0), jnp.int32(0), jnp.int32(0))
    _, rows = jax.lax.scan(step, init, sizes.astype(jnp.int32))
    return rows


@partial(jax.jit, static_argnames=("max_segments", "window", "decreasing"))
def first_fit_rows(
    sizes: Int[Array, " n"], seq_len: Int[Array, ""], *, max_segments: int, window: int, decreasing: bool
) -> Int[Array, " n"]:
    """``int32[n]``: the row of each example under windowed first fit (``sizes`` already truncated
    to ``seq_len``). Rows are numbered across windows in order; within a window, in the order they
    were opened."""
    sizes = sizes.astype(jnp.int32)
    n = sizes.shape[0]
    w = max(1, min(window, n))
    windows = -(-n // w)
    padded = jnp.pad(sizes, (0, windows * w - n)).reshape(windows, w)  # size 0: no example
    lanes = jnp.arange(w, dtype=jnp.int32)
    if decreasing:  # largest first, ties in the given order: one int32 sort key
        key = (seq_len - padded) * w + lanes[None, :]
        order = jnp.sort(key, axis=1) % w
    else:
        order = jnp.broadcast_to(lanes[None, :], (windows, w))
    ranked = jnp.take_along_axis(padded, order, axis=1)
    win = jnp.arange(windows, dtype=jnp.int32)

    def step(state, size):
        free, count, opened = state  # [windows, w] free slots and members per bin; bins opened
        fits = (free >= size[:, None]) & (count < max_segments)
        first = jnp.min(jnp.where(fits, lanes[None, :], w), axis=1)  # a fresh bin always fits
        real = size > 0
        target = jnp.where(real, first, w)  # w: no change (dropped)
        free = free.at[win, target].add(-size, mode="drop")
        count = count.at[win, target].add(1, mode="drop")
        opened = jnp.where(real, jnp.maximum(opened, first + 1), opened)
        return (free, count, opened), first

    init = (jnp.full((windows, w), seq_len, jnp.int32), jnp.zeros((windows, w), jnp.int32),
            jnp.zeros((windows,), jnp.int32))  # fmt: skip
    (_, _, opened), bins = jax.lax.scan(step, init, ranked.T)
    unsort = jnp.zeros_like(order).at[win[:, None], order].set(lanes[None, :])
    bins = jnp.take_along_axis(bins.T, unsort, axis=1)
    first_row = jnp.cumsum(opened) - opened
    return (first_row[:, None] + bins).reshape(-1)[:n]


@partial(jax.jit, static_argnames=("decreasing",))
def pack_tables(rows: Int[Array, " n"], sizes: Int[Array, " n"], *, decreasing: bool = False) -> PackTables:
    """The ``PackTables`` of a packing: examples grouped by their row, each row's members in the
    order they joined it (the given order; largest first, ties in the given order, with
    ``decreasing``)."""
    n = rows.shape[0]
    index = jnp.arange(n, dtype=jnp.int32)
    if decreasing:
        by_size = jnp.lexsort((index, -sizes.astype(jnp.int32), rows))
    else:
        by_size = jnp.lexsort((index, rows))
    members = by_size.astype(jnp.int32)
    num_rows = jnp.max(rows) + 1 if n else jnp.int32(0)
    row_start = jnp.searchsorted(rows[members], jnp.arange(n + 1, dtype=jnp.int32), side="left")
    return PackTables(
        members=members, row_start=row_start.astype(jnp.int32), num_rows=num_rows.astype(jnp.int32)
    )


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
        chat: the mask spans follow the token spans (chat data) or not (supervised).
        mask_prompt: train on assistant / completion tokens only (Levanter's ``mask_user_turns``,
            ``mask_inputs``).
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
