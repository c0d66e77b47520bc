"""Era and two-level block shuffles, built on keyed permutations.

Era shuffle (Levanter's ``EraShufflingDataset``): index ``i`` in era ``e = i // era_length`` moves
within its era by the permutation keyed ``fold_in(key, e)``; the last era may be shorter.

    length = 10, era_length = 4:  [0 1 2 3 | 4 5 6 7 | 8 9]  ->  e.g. [2 0 3 1 | 5 7 4 6 | 9 8]

Block shuffle (marin's ``BlockShufflingDataset``; ``blockwise-shuffle-plan.md``): full blocks of
``io_block_size`` examples are permuted by ``block_key``; logical positions are cut into windows
of ``window_blocks`` blocks, and inside window ``w`` the full-block region is permuted by
``fold_in(window_full_key, w)``. A partial tail block stays last and moves only within itself,
by ``fold_in(window_tail_key, w)``. ``block_key, window_full_key, window_tail_key = split(key, 3)``.

    length = 10, io_block_size = 3, window_blocks = 2: blocks [0..2][3..5][6..8] + tail [9]
    window 0 reads two whole blocks (say physical 2 and 0) in a mixed order; window 1 reads
    block 1 and then the tail, still last.

Both accept ``epoch``: with it, every key above is first replaced by ``fold_in(key, epoch)``
(epoch 0 keeps the plain key). Per-era and per-window key schedules are derived on device; when
the indices of a call (in one epoch) span at most ``MAX_TABLE_GROUPS`` eras, or half as many
block-shuffle windows (a window has a full-block and a tail schedule), each schedule is derived
once and gathered instead of once per index; a training batch does.
"""

from __future__ import annotations

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Key, UInt32

from .permutation import (
    INVALID,
    Compat,
    KeyedShuffle,
    Kind,
    _is_none,
    apply_network,
    apply_small,
    derive_network,
    keys_for,
    rewrap,
    small_order,
)

U32 = jnp.uint32
MAX_TABLE_GROUPS = 8


def _per_lane(make, group: UInt32[Array, " n"], valid: Bool[Array, " n"], per_lane_key: bool):
    """``make(group)`` (a batched network), derived once per distinct group when they are few and
    share one key (not ``per_lane_key``).

    Out-of-range lanes (their result is discarded) take a valid lane's group, so they do not
    widen the span.
    """
    n = group.shape[0]
    if per_lane_key or n <= 2 * MAX_TABLE_GROUPS:
        return make(group)
    group = jnp.where(valid, group, group[jnp.argmax(valid)])
    low = jnp.min(group)

    def table():
        net = make(low + jnp.arange(MAX_TABLE_GROUPS, dtype=U32))
        return jax.tree.map(lambda leaf: leaf[group - low], net)

    return jax.lax.cond(jnp.max(group) - low < MAX_TABLE_GROUPS, table, lambda: make(group))


def _fold_in(key: Key[Array, "*lanes"], data: UInt32[Array, " n"], per_lane_key: bool) -> Key[Array, " n"]:
    if per_lane_key:
        return jax.vmap(jax.random.fold_in)(key, data)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, data)


class EraShuffle(KeyedShuffle):
    """Levanter's era shuffle as a jittable bijection of ``[0, length)``."""

    era_length: UInt32[Array, ""]

    def _impl(self, indices, epoch):
        x, valid = self._lanes(indices)
        era = x // self.era_length
        start = era * self.era_length
        base, per_lane_key = keys_for(self.key, epoch)

        def era_size(e):
            remaining = self.length - jnp.minimum(e * self.era_length, self.length - U32(1))
            return jnp.minimum(self.era_length, remaining)

        def make(eras):
            return derive_network(self.kind, self.compat, _fold_in(base, eras, per_lane_key), era_size(eras))

        net = _per_lane(make, era, valid, per_lane_key)
        y = apply_network(self.kind, net, x - start, era_size(era), batched=True)
        return jnp.where(valid, start + y, U32(INVALID)).reshape(indices.shape)


class BlockShuffle(KeyedShuffle):
    """marin's two-level block shuffle as a jittable bijection of ``[0, length)``.

    ``block_order``, when ``with_orders`` made it, is the plain key's order of the full blocks
    (``small_order``).
    """

    io_block_size: UInt32[Array, ""]
    window_blocks: UInt32[Array, ""]
    block_order: UInt32[Array, "*members small"] | None = None

    def with_orders(self) -> BlockShuffle:
        """This shuffle with its ``block_order`` (one per member of a stack)."""
        order = _block_orders(self.kind, self.compat, self.key, self.length, self.io_block_size)
        return eqx.tree_at(lambda s: s.block_order, self, order, is_leaf=_is_none)

    def _impl(self, indices, epoch):
        x, valid = self._lanes(indices)
        io, wb = self.io_block_size, self.window_blocks

        full_blocks = self.length // io
        tail = self.length - full_blocks * io
        total_blocks = full_blocks + (tail > 0).astype(U32)
        window_size = io * wb  # examples in a window of full blocks; <= length unless one window
        last_window = (total_blocks - U32(1)) // wb
        window = jnp.minimum(x // window_size, last_window)
        offset = x - window * window_size

        def layout(w):
            block_start = w * wb
            blocks_here = jnp.minimum(wb, total_blocks - block_start)
            has_tail = (tail > 0) & (block_start + blocks_here == total_blocks)
            full_region = (blocks_here - has_tail.astype(U32)) * io
            return block_start, full_region, jnp.where(has_tail, tail, U32(0))

        block_start, full_region, _ = layout(window)
        in_tail = offset >= full_region
        stage_size = jnp.where(in_tail, tail, full_region)
        stage_x = jnp.where(in_tail, offset - full_region, offset)

        base, per_lane_key = keys_for(self.key, epoch)
        if per_lane_key:
            split = jax.vmap(lambda k: jax.random.split(k, 3))(base)
            block_key, full_key, tail_key = split[:, 0], split[:, 1], split[:, 2]
        else:
            block_key, full_key, tail_key = jax.random.split(base, 3)

        def stage_network(group):
            w, is_tail = group // U32(2), (group & U32(1)) == 1
            _, full_w, tail_w = layout(w)
            size = jnp.maximum(jnp.where(is_tail, tail_w, full_w), U32(1))
            keys_full = _fold_in(full_key, w, per_lane_key)
            keys_tail = _fold_in(tail_key, w, per_lane_key)
            data = jnp.where(is_tail[:, None], jax.random.key_data(keys_tail), jax.random.key_data(keys_full))
            return derive_network(self.kind, self.compat, rewrap(data, full_key), size)

        group = window * U32(2) + in_tail.astype(U32)
        net = _per_lane(stage_network, group, valid, per_lane_key)
        permuted = apply_network(self.kind, net, stage_x, jnp.maximum(stage_size, U32(1)), batched=True)

        block = jnp.where(in_tail, U32(0), block_start + permuted // io)

        def block_net():
            return derive_network(self.kind, self.compat, block_key, jnp.maximum(full_blocks, U32(1)))

        if epoch is None and self.block_order is not None:  # few blocks are looked up
            physical = apply_small(
                self.kind, block_net, self.block_order, block, full_blocks, batched=per_lane_key
            )
        else:
            physical = apply_network(self.kind, block_net(), block, full_blocks, batched=per_lane_key)
        full_out = physical * io + (permuted - (permuted // io) * io)
        tail_out = full_blocks * io + permuted
        out = jnp.where(in_tail, tail_out, full_out)
        return jnp.where(valid, out, U32(INVALID)).reshape(indices.shape)


def _block_order(kind: Kind, compat: Compat, key, length, io_block_size) -> UInt32[Array, " small"]:
    """The plain key's ``small_order`` of the full blocks (as ``BlockShuffle._impl`` derives it)."""
    full_blocks = length // io_block_size
    block_key = jax.random.split(key, 3)[0]
    network = derive_network(kind, compat, block_key, jnp.maximum(full_blocks, U32(1)))
    return small_order(kind, network, full_blocks)


@partial(jax.jit, static_argnums=(0, 1))
def _block_orders(kind: Kind, compat: Compat, key, length, io_block_size) -> UInt32[Array, "*members small"]:
    """``_block_order`` of each member of a stack (leading axis), or of one shuffle."""
    if key.ndim == 0:
        return _block_order(kind, compat, key, length, io_block_size)
    return jax.vmap(partial(_block_order, kind, compat))(key, length, io_block_size)
