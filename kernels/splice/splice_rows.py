"""Splice schedules: a closed-form map from an epoch row to ``(doc, t, s, copy_len)``.

A schedule never lists its pairs. Each document ``d`` owns a contiguous block of ``quota[d]``
rows (``cum_rows`` holds the block starts) and a number of distinct placements ``items[d]``; a row
is located by binary search over ``cum_rows`` (O(log num_docs)), spread over the document's
placements by quantile mapping, and turned into ``(t, s, copy_len)`` by the mode's placement
(``PairPlacement`` enumerates ``(t, s)`` pairs; ``BalancedPlacement`` samples coverage-balanced
starts). Memory is O(num_docs) plus one table of at most ``seq_len`` entries shared by all
documents.

Quota rows are interleaved into passes, so a document whose quota exceeds its placements repeats
them pass by pass, in the order the seed's replication would list them:

    items = 2, quota = 4:  row 0 1 2 3  ->  quantile j 0 2 1 3  ->  item 0 1 0 1
    items = 5, quota = 2:  row 0 1      ->  quantile j 0 1      ->  item 1 3   (midpoints)

Everything is uint32/int32 arithmetic; ``muldiv`` (``meshbatch.kernels.uint32``) forms 64-bit
products from 16-bit limbs, so no row needs ``jax_enable_x64``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from jaxtyping import Array, Int, Integer, PRNGKeyArray, Real, UInt32

from ..keys import rewrap
from ..shuffles.permutation import apply_network, check_epoch, check_indices, derive_network
from ..uint32 import ceil_div, muldiv

U32 = jnp.uint32


def search_last(
    value_at: Callable[[Array], Array],
    target: Real[Array, "*n"],
    size: int | Integer[Array, "*#n"],
    *,
    steps: int,
) -> Int[Array, "*n"]:
    """Largest ``k`` in ``[0, size)`` with ``value_at(k) <= target``, for non-decreasing ``value_at``.

    Branchless and elementwise: ``steps`` (static, ``>= bit_length(max size)``) halvings, each one
    ``value_at`` evaluation. Requires ``value_at(0) <= target`` and ``size >= 1``.
    """
    base = jnp.zeros_like(target, dtype=jnp.int32)  # sharded like the rows
    n = jnp.maximum(jnp.asarray(size).astype(jnp.int32), 1)
    for _ in range(steps):
        half = n // 2
        probe = base + half
        base = jnp.where(value_at(probe) <= target, probe, base)
        n = n - half
    return base


def interleave(r: UInt32[Array, "..."], quota: UInt32[Array, "..."], items: UInt32[Array, "..."]):
    """Quantile index of block row ``r``: the ``quota`` quantiles laid out pass by pass.

    Quantile ``j = k * passes + c`` is pass ``c``'s ``k``-th point; rows visit pass 0 first, so a
    quota that is a multiple of ``items`` replays the placements in order once per pass.
    """
    passes = jnp.maximum(ceil_div(quota, jnp.maximum(items, U32(1))), U32(1))
    per_pass = ceil_div(quota, passes)  # rows of a full pass
    full = quota - (per_pass - U32(1)) * passes  # passes holding per_pass rows; the rest one fewer
    in_full = r < full * per_pass
    rest = r - full * per_pass
    short = jnp.maximum(per_pass - U32(1), U32(1))
    c = jnp.where(in_full, r // per_pass, full + rest // short)
    k = jnp.where(in_full, r % per_pass, rest % short)
    return k * passes + c


def midpoint_item(j: UInt32[Array, "..."], quota: UInt32[Array, "..."], items: UInt32[Array, "..."]):
    """Placement ``floor((j + 1/2) * items / quota)``: quantile ``j`` of ``quota`` evenly spread."""
    return muldiv(j, items, items // U32(2), jnp.maximum(quota, U32(1)))


def sharded_like_rows(fn: Callable, rows: Array, *args):
    """``fn(*args)`` with every output sharded like ``rows`` on its first axis.

    Row kernels gather from replicated tables with row-sharded indices; under explicit mesh axes
    such a gather has no unambiguous output sharding. Run ``fn`` with those axes in auto mode and
    pin the outputs to the row sharding. Without a mesh (or explicit axes) this is ``fn(*args)``.
    """
    typeof = getattr(jax, "typeof", None)  # sharding in types (JAX >= 0.6)
    sharding = getattr(typeof(rows), "sharding", None) if typeof is not None else None
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty or not mesh.explicit_axes:
        return fn(*args)
    out = NamedSharding(mesh, PartitionSpec(sharding.spec[0] if len(sharding.spec) else None))
    return jax.sharding.auto_axes(fn, axes=mesh.explicit_axes, out_sharding=out)(*args)


class LanePermutation(eqx.Module):
    """Per-lane keyed bijections of ``[0, length)``: lane ``i`` uses ``(key, epoch, doc, salt)``.

    Shuffles one axis of a splice schedule inside each document: the starts of one round, or the
    placements of one start. Built on ``meshbatch.kernels.shuffles.permutation``'s networks (strong Feistel
    with cycle walking), which take per-lane lengths and keys. ``window > 0`` shuffles like an
    era shuffle: ``x`` stays in its window ``[w * window, (w + 1) * window)`` (the last one
    shorter), permuted there with the window's own key:

        length 7, window 3:  windows [0 1 2] [3 4 5] [6]  ->  e.g. [2 0 1] [4 5 3] [6]
    """

    key: PRNGKeyArray
    window: int = eqx.field(static=True, default=0)

    def __call__(self, x, length, epoch, doc, salt):
        x, length = x.astype(U32), length.astype(U32)
        doc, salt = jnp.broadcast_to(doc, x.shape).astype(U32), jnp.broadcast_to(salt, x.shape).astype(U32)
        epoch = jnp.broadcast_to(epoch, x.shape).astype(U32)  # one epoch, or one per lane
        lanes = (epoch, doc, salt)
        base = jnp.zeros_like(x)
        if self.window:
            block = x // U32(self.window)
            base = block * U32(self.window)
            x, length = x - base, jnp.minimum(U32(self.window), length - base)
            lanes = (*lanes, block)

        def lane_key(e, d, c, *block):
            key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(self.key, e), d), c)
            return jax.random.key_data(jax.random.fold_in(key, block[0]) if block else key)

        keys = rewrap(jax.vmap(lane_key)(*lanes), self.key)
        network = derive_network("feistel", None, keys, length)
        return base + apply_network("feistel", network, x, length, batched=True)


class SpliceSchedule(eqx.Module):
    """Rows of one epoch → ``(doc, t, s, copy_len)``; a pytree of per-document tables.

    Build it with ``meshbatch.splice_schedule``. ``lookup`` is jittable, never recompiles for new
    rows or epochs, and costs O(log num_docs + log doc_length) per row.

    Attributes:
        cum_rows: ``uint32[num_docs + 1]`` first epoch row of each document's block.
        items: ``uint32[num_docs]`` distinct placements of each document.
        placement: the mode's ``(doc, quantile) -> (t, s, copy_len)`` map.
        shuffle: optional permutation module ``perm(rows, epoch)`` applied to rows first.
        doc_steps: binary-search steps over documents (static).
    """

    cum_rows: UInt32[Array, " docs_plus_one"]
    items: UInt32[Array, " docs"]
    placement: eqx.Module
    shuffle: eqx.Module | None
    doc_steps: int = eqx.field(static=True)

    def __len__(self) -> int:
        """Rows per epoch (host only: reads the last ``cum_rows`` entry)."""
        return int(np.asarray(self.cum_rows[-1]))

    @property
    def num_docs(self) -> int:
        return self.items.shape[0]

    def lookup(
        self,
        rows: Integer[Array | np.ndarray, " n"],
        epoch: Integer[Array | np.ndarray, ""] | Integer[Array | np.ndarray, " n"] | int | np.integer = 0,
    ) -> tuple[Int[Array, " n"], Int[Array, " n"], Int[Array, " n"], Int[Array, " n"]]:
        """Map epoch rows to placements (jitted).

        Args:
            rows: rows in ``[0, len(self))``, any integer dtype, jax or numpy (host callers pass
                numpy on purpose: concrete rows are range-checked here, then made ``uint32``).
            epoch: the epoch, scalar or one per row; reshuffles and jitter depend on it.

        Returns:
            ``(doc, t, s, copy_len)``, each ``int32[n]``.

        Raises:
            IndexError: concrete rows outside ``[0, len(self))``.
            ValueError: a concrete epoch outside ``[0, 2**32)``, or epochs not one per row.
            TypeError: rows or epochs that are not integers.
        """
        if not isinstance(self.cum_rows, jax.core.Tracer):
            check_indices(rows, len(self), name="row")
        check_epoch(epoch)
        rows = rows if isinstance(rows, jax.Array) else np.asarray(rows).astype(np.uint32)
        epoch = epoch if isinstance(epoch, jax.Array) else np.asarray(epoch).astype(np.uint32)
        if epoch.ndim and epoch.shape != rows.shape:
            raise ValueError(
                "epoch must be a scalar or one per row "
                f"(got epoch shape {epoch.shape}, rows shape {rows.shape})"
            )
        return _lookup(self, jnp.asarray(rows).astype(U32), jnp.asarray(epoch).astype(U32))


def lookup_rows(
    schedule: SpliceSchedule,
    rows: UInt32[Array, " n"],
    epoch: UInt32[Array, "*n"] | int,
    *,
    shuffled: bool = True,
) -> tuple[Int[Array, " n"], Int[Array, " n"], Int[Array, " n"], Int[Array, " n"]]:
    """``schedule.lookup`` unjitted, for the plan kernel: ``(doc, t, s, copy_len)``, int32.

    ``shuffled=False`` skips the epoch row permutation (canonical order, e.g. for coverage counts).
    """
    rows = jnp.asarray(rows).astype(U32)
    epoch = jnp.asarray(epoch).astype(U32)
    return sharded_like_rows(partial(_lookup_rows, shuffled=shuffled), rows, schedule, rows, epoch)


def _lookup_rows(schedule: SpliceSchedule, rows, epoch, *, shuffled: bool):
    if shuffled and schedule.shuffle is not None:
        rows = schedule.shuffle(rows, epoch)
    cum = schedule.cum_rows
    doc = search_last(lambda d: cum[d], rows, cum.shape[0] - 1, steps=schedule.doc_steps)
    quota = cum[doc + 1] - cum[doc]
    items = schedule.items[doc]
    j = interleave(rows - cum[doc], quota, items)
    t, s, copy_len = schedule.placement.place(doc, j, quota, items, rows=rows, epoch=epoch)
    return doc, t, s, copy_len


_lookup = jax.jit(lookup_rows, static_argnames="shuffled")
