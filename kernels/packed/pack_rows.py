"""The packing plan of variable-length examples: which examples share a row, in what order.

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
"""

from __future__ import annotations

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

PACK_RULES: tuple[str, ...] = ("greedy", "first_fit")


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
