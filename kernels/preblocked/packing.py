"""The packing plan: where each document, wrapped in ``[DOC] ... [EOD]``, lands in fixed-size blocks.

A document of ``L`` tokens takes ``L + 2`` consecutive slots of the row-major block stream
(``[DOC]``, its tokens, ``[EOD]``). The plan says, for each document, the block and position of its
``[DOC]`` slot; everything else follows, because a document's slots are always consecutive:

* a document that fits a block (``L + 2 <= block_size``) is never split: it goes whole into one
  block, and only block tails are padded;
* a longer document starts where the stream stands (in the free tail of the last block opened, or
  at a fresh block) and runs on through the following blocks.

Two rules choose the blocks:

``greedy`` (plain next-fit, stream order): a document that fits the current block's free tail goes
there, otherwise it opens the next block. One pass, nothing reordered.

``ffd`` (buffered document grouping, first-fit decreasing): documents are taken ``buffer_docs`` at
a time, in stream order. Within a buffer the long documents go first, in stream order, each
continuing the stream as above; then the others, largest first (ties in stream order), each into
the first block of the buffer with room for it, a new block when none has. A buffer's blocks are
emitted in the order they were opened, right after the previous buffer's.

    block_size = 8, lengths [1, 4, 2, 9]       (D = [DOC], E = [EOD], _ = pad; (block, offset))
    greedy                                     ffd (one buffer; sizes 11 (long), 6, 4, 3)
    block 0 [D a E _ _ _ _ _]  doc 0 (0, 0)    block 0 [D d d d d d d d]  doc 3 (0, 0)
    block 1 [D b b b b E _ _]  doc 1 (1, 0)    block 1 [d d E D c c E _]  doc 2 (1, 3)
    block 2 [D c c E D d d d]  doc 2 (2, 0)    block 2 [D b b b b E _ _]  doc 1 (2, 0)
    block 3 [d d d d d d E _]  doc 3 (2, 4)    block 3 [D a E _ _ _ _ _]  doc 0 (3, 0)

Work is int32 and per document O(1) (``greedy``) or O(``buffer_docs``) (``ffd``); buffers run in
parallel (``vmap``), each as one ``lax.scan`` over its documents.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

PackingRule = Literal["greedy", "ffd"]
PACKING_RULES: tuple[str, ...] = ("greedy", "ffd")
MARKERS = 2  # [DOC] and [EOD] around every document
GROUP = 32  # bins per first-fit group


class Placement(eqx.Module):
    """Where each document's ``[DOC]`` slot lands.

    Attributes:
        block: ``int32[n]`` block index.
        offset: ``int32[n]`` position in that block.
        num_blocks: ``int32[]`` blocks the plan fills.
    """

    block: Int[Array, " n"]
    offset: Int[Array, " n"]
    num_blocks: Int[Array, ""]


def pack_plan(
    lengths: Int[Array, " n"],
    num_docs: Int[Array, ""] | None = None,
    *,
    block_size: int,
    rule: PackingRule = "ffd",
    buffer_docs: int = 1024,
) -> Placement:
    """The packing plan of documents of ``lengths`` tokens (markers excluded), in stream order.

    Jitted; only ``rule``, ``buffer_docs`` and the shape of ``lengths`` select a compilation (the
    block size is passed on as an array, so other block sizes reuse it).

    Args:
        lengths: ``int32[n]`` tokens per document; the caller keeps ``lengths + 2 + 2 * block_size``
            and the total block count below ``2**31``.
        num_docs: ``int32[]``: only the first ``num_docs`` entries are documents (the rest pad the
            shape, so that one compilation serves many corpus sizes; their placement is
            meaningless); ``None``: all ``n``.
        block_size: slots per block.
        rule: ``"greedy"`` or ``"ffd"`` (see the module docstring).
        buffer_docs: documents grouped per buffer with ``"ffd"``;
            ``(block_size + 2) * buffer_docs < 2**31``.

    Returns:
        The ``Placement`` of every document, in the order given.

    Raises:
        ValueError: an unknown rule or out-of-range sizes.
    """
    if rule not in PACKING_RULES:
        raise ValueError(f"rule={rule!r} is not one of {PACKING_RULES}")
    if block_size < 1 or buffer_docs < 1:
        raise ValueError(f"block_size and buffer_docs must be >= 1 (got {block_size=}, {buffer_docs=})")
    if (block_size + 2) * buffer_docs >= 2**31:
        raise ValueError(f"need (block_size + 2) * buffer_docs < 2**31 (got {block_size=}, {buffer_docs=})")
    num_docs = jnp.int32(lengths.shape[0]) if num_docs is None else num_docs
    if rule == "greedy":
        return _greedy(lengths, num_docs, jnp.int32(block_size))
    return _ffd(lengths, num_docs, jnp.int32(block_size), buffer_docs=buffer_docs)


def _sizes(lengths: Int[Array, " n"], num_docs: Int[Array, ""]) -> Int[Array, " n"]:
    """Slots per document, 0 for the padding entries (no document, for both rules)."""
    sizes = lengths.astype(jnp.int32) + MARKERS
    return jnp.where(jnp.arange(sizes.shape[0]) < num_docs, sizes, 0)


@jax.jit
def _greedy(lengths: Int[Array, " n"], num_docs: Int[Array, ""], S: Int[Array, ""]) -> Placement:
    def step(carry, size):
        block, used = carry  # the current block and its filled slots (size 0 changes neither)
        fresh = jnp.where(size > S, used == S, used + size > S)
        start_block = jnp.where(fresh, block + 1, block)
        start = jnp.where(fresh, 0, used)
        end = start + size  # one past the last slot, counted from start_block
        return (start_block + (end - 1) // S, (end - 1) % S + 1), (start_block, start)

    (last, _), (block, offset) = jax.lax.scan(step, (jnp.int32(-1), S), _sizes(lengths, num_docs))
    return Placement(block=block, offset=offset, num_blocks=last + 1)


@partial(jax.jit, static_argnames=("buffer_docs",))
def _ffd(
    lengths: Int[Array, " n"], num_docs: Int[Array, ""], S: Int[Array, ""], *, buffer_docs: int
) -> Placement:
    sizes = _sizes(lengths, num_docs)
    n = sizes.shape[0]
    m = max(1, min(buffer_docs, n))
    buffers = -(-n // m)
    padded = jnp.pad(sizes, (0, buffers * m - n)).reshape(buffers, m)  # size 0: no document
    ref, offset, back, pre, opened = _ffd_buffers(padded, S)
    # A buffer's bin j is its block j + (full blocks that long documents put before bins 0..j).
    bin_block = jnp.arange(m, dtype=jnp.int32)[None, :] + jnp.cumsum(pre, axis=1, dtype=jnp.int32)
    per_buffer = opened + jnp.sum(pre, axis=1, dtype=jnp.int32)
    first = jnp.cumsum(per_buffer, dtype=jnp.int32) - per_buffer
    block = first[:, None] + jnp.take_along_axis(bin_block, ref, axis=1) - back
    return Placement(
        block=block.reshape(-1)[:n],
        offset=offset.reshape(-1)[:n],
        num_blocks=jnp.sum(per_buffer, dtype=jnp.int32),
    )


def _ffd_buffers(sizes: Int[Array, "buffers m"], S: Int[Array, ""]):
    """All buffers at once, one ``lax.scan`` step per rank in the size order. Per document: the
    bin it refers to, its offset there, and how many blocks before that bin it starts; per bin:
    the full blocks put just before it; per buffer: the bins opened.

    First fit looks at bins ``GROUP`` at a time: the first group whose largest free tail has room,
    then the first bin in it; only the groups of the (at most two) bins a document changes are
    re-measured, so a step costs ``O(M / GROUP + GROUP)`` per buffer instead of ``O(M)``. The
    buffers are explicit rows (not ``vmap``) so that the bin tables update in place.
    """
    buffers, m = sizes.shape
    groups = -(-m // GROUP)
    M = groups * GROUP
    # Long documents first in stream order, then the rest largest first, ties in stream order, as
    # one int32 sort key (a single-operand sort is several times faster than argsort on CPU).
    rank = (S + 1 - jnp.minimum(sizes, S + 1)) * m + jnp.arange(m, dtype=jnp.int32)[None, :]
    order = jnp.sort(rank, axis=1) % m
    rows = jnp.arange(buffers, dtype=jnp.int32)
    group_ids = jnp.arange(groups, dtype=jnp.int32)[None, :]
    lanes = jnp.arange(GROUP, dtype=jnp.int32)[None, :]

    def group_of(free, g):
        return free.reshape(buffers, groups, GROUP)[rows, g]  # [buffers, GROUP]

    def step(state, size):
        free, top, opened, pre = state  # free slots per bin (S: not opened), group maxima, ...
        last = jnp.maximum(opened - 1, 0)
        last_free = jnp.where(opened > 0, free[rows, last], 0)
        # a long document continues the stream: the free tail of the last bin, full blocks, a tail
        rest = size - last_free
        full = (rest + S - 1) // S - 1
        tail = rest - full * S  # in [1, S]
        g = jnp.min(jnp.where(top >= size[:, None], group_ids, groups), axis=1)  # a fresh bin has room
        window = group_of(free, g)
        lane = jnp.min(jnp.where(window >= size[:, None], lanes, GROUP), axis=1)
        first_fit = g * GROUP + lane
        fit_free = window[rows, jnp.minimum(lane, GROUP - 1)]
        is_long = size > S
        valid = size > 0
        in_last = last_free > 0
        # at most two bins change; index M means no change (dropped)
        closed = jnp.where(valid & is_long & in_last, last, M)
        target = jnp.where(valid, jnp.where(is_long, opened, first_fit), M)
        value = jnp.where(is_long, S - tail, fit_free - size)
        # one scatter after every read of free, so that XLA updates it in place
        changed = jnp.stack([closed, target], axis=1)
        free = free.at[rows[:, None], changed].set(jnp.stack([jnp.zeros_like(value), value], 1), mode="drop")
        touched = jnp.minimum(changed, M - 1) // GROUP
        high = jnp.max(free.reshape(buffers, groups, GROUP)[rows[:, None], touched], axis=2)
        top = top.at[rows[:, None], jnp.where(changed < M, touched, groups)].set(high, mode="drop")
        pre = pre.at[rows, jnp.where(valid & is_long, opened, M)].set(full, mode="drop")
        opened = jnp.where(valid, jnp.where(is_long, opened + 1, jnp.maximum(opened, first_fit + 1)), opened)
        ref = jnp.where(is_long, jnp.where(in_last, last, target), first_fit)
        offset = jnp.where(is_long, jnp.where(in_last, S - last_free, 0), S - fit_free)
        back = jnp.where(is_long & ~in_last, full, 0)
        return (free, top, opened, pre), (ref, offset, back)

    init = (
        jnp.full((buffers, M), S, jnp.int32),
        jnp.full((buffers, groups), S, jnp.int32),
        jnp.zeros((buffers,), jnp.int32),
        jnp.zeros((buffers, M), jnp.int32),
    )
    ranked = jnp.take_along_axis(sizes, order, axis=1)
    (_, _, opened, pre), out = jax.lax.scan(step, init, ranked.T)
    unsort = jnp.zeros_like(order).at[rows[:, None], order].set(jnp.arange(m, dtype=order.dtype)[None, :])
    ref, offset, back = (jnp.take_along_axis(x.T, unsort, axis=1) for x in out)
    return ref, offset, back, pre[:, :m], opened
