"""Feistel networks with cycle walking: O(1)-memory permutations of ``[0, n)`` for any ``n``.

One cycle-walking kernel drives two round structures:

* ``levanter``: bit-identical to ``levanter.data._prp.FeistelPermutation``. The domain is
  ``2^(2 rb)`` with ``rb = ceil(log2(n) / 2)``; five rounds of ``(L, R) -> (R, L ^ F(R))`` with the
  affine ``F(R, k) = (R * 2654435761 + k) mod 2^rb``.
* ``strong`` (the default): a mixed-radix Feistel on ``[0, a*b)`` with ``a = ceil(sqrt(n))``,
  ``b = ceil(n / a)``, so the domain exceeds ``n`` by less than ``sqrt(n)`` and cycle walking almost
  never runs twice. Each round maps ``x = L*b + R -> R*a + (L + F(R)) mod a`` (then ``a``, ``b``
  swap), with ``F`` the murmur3 finaliser of ``R ^ k`` scaled into ``[0, a)``; both halves are at
  least ``MIN_HALF`` wide so tiny ``n`` still get well-mixed orders.

Cycle walking re-applies the network until the value lands in ``[0, n)``; since the network is a
bijection of a domain that contains ``[0, n)``, the walk is a bijection of ``[0, n)``.

    n = 5, strong: domain 16 x 16 = 256; x -> E(x) -> E(E(x)) ... until < 5

Every parameter is an array broadcastable against the indices, so one compiled kernel serves
every length and key, and per-element parameters (era shuffles' shorter last era, block shuffles'
tail) cost nothing extra. Everything is uint32; the float32 reciprocal only estimates a quotient
that integer arithmetic then corrects exactly.
"""

from __future__ import annotations

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float32, UInt32

from ..scan import compact

U32 = jnp.uint32
LEVANTER_ROUNDS = 5
LEVANTER_MULTIPLIER = 2654435761
STRONG_ROUNDS = 5
MIN_HALF = 16
# Cycle-walk steps fused into one pass over the data before the loop re-checks for stragglers.
WALK_UNROLL = 2
# The walk's layout: lanes in groups of GROUP (the compaction unit). Dense steps run while more
# than 1/COMPACT_AT of the groups hold a straggler; then those groups are gathered, recursively,
# at most COMPACT_DEPTH levels deep.
GROUP = 8
COMPACT_AT = 8
COMPACT_DEPTH = 3


class LevanterNetwork(eqx.Module):
    """Round keys and half width of Levanter's network; arrays broadcast against the indices."""

    keys: UInt32[Array, "... rounds"]
    right_bits: UInt32[Array, "..."]

    def __call__(self, x: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
        rb = self.right_bits
        mask = (U32(1) << rb) - U32(1)
        right = x & mask
        left = x >> rb
        for i in range(self.keys.shape[-1]):
            f = (right * U32(LEVANTER_MULTIPLIER) + self.keys[..., i]) & mask
            left, right = right, left ^ f
        return (left << rb) | right


def _round_hash(h: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
    """murmur3's fmix32 without its first and last xor-shifts, for ``h = R ^ k'``.

    The first (``h ^= h >> 16``) only XORs the constant high half of ``R ^ k`` (``R < 2^16``) into
    the low half, so callers fold it into the key: ``k' = k ^ (k >> 16)``. The last cannot change
    ``h >> 16``, the only bits read.
    """
    h = h * U32(0x85EBCA6B)
    h = h ^ (h >> 13)
    return h * U32(0xC2B2AE35)


def _scale(h: UInt32[Array, "..."], m: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
    """``floor((h >> 16) * m / 2^16)``: a 32-bit hash mapped into ``[0, m)``, ``m <= 2^16``."""
    return ((h >> 16) * m) >> 16


def _divmod(x: UInt32[Array, "..."], d: UInt32[Array, "..."], inv_d: Float32[Array, "..."]):
    """Exact ``(x // d, x % d)`` for ``x // d < 2^17``, without integer division.

    The float32 estimate is within one of the true quotient (relative error < 2^-22 on a quotient
    below 2^17), and one signed correction each way makes it exact.
    """
    q = jnp.floor(x.astype(jnp.float32) * inv_d).astype(jnp.int32)
    r = x.astype(jnp.int32) - q * d.astype(jnp.int32)  # wraps like uint32; |r| < 2 d
    low = r < 0
    q = jnp.where(low, q - 1, q)
    r = jnp.where(low, r + d.astype(jnp.int32), r)
    high = r >= d.astype(jnp.int32)
    q = jnp.where(high, q + 1, q)
    r = jnp.where(high, r - d.astype(jnp.int32), r)
    return q.astype(U32), r.astype(U32)


class StrongNetwork(eqx.Module):
    """A mixed-radix Feistel network on ``[0, a*b)``; arrays broadcast against the indices."""

    keys: UInt32[Array, "... rounds"]
    a: UInt32[Array, "..."]
    b: UInt32[Array, "..."]

    def __call__(self, x: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
        # The halves stay split across rounds: one divmod per pass, not one per round.
        left, right = _divmod(x, self.b, 1.0 / self.b.astype(jnp.float32))  # left < a, right < b
        a, b = self.a, self.b
        keys = self.keys ^ (self.keys >> 16)  # fmix32's first step, folded in (see _round_hash)
        for i in range(keys.shape[-1]):
            s = left + _scale(_round_hash(right ^ keys[..., i]), a)
            # (left + f) mod a for left, f < a: s - a wraps above s exactly when s < a.
            left, right = right, jnp.minimum(s, s - a)  # new left < b, new right < a
            a, b = b, a
        return left * b + right  # < a * b


def strong_halves(length: UInt32[Array, "..."]) -> tuple[UInt32[Array, "..."], UInt32[Array, "..."]]:
    """``a = max(ceil(sqrt(n)), MIN_HALF)``, ``b = max(ceil(n / a), MIN_HALF)``.

    ``a * b >= n`` and ``a * b <= 2^32`` for every ``n < 2^32``, so domain values fit uint32.
    """
    a = jnp.ceil(jnp.sqrt(length.astype(jnp.float32))).astype(jnp.int32)
    a = jnp.clip(a, 1, 65536).astype(U32)
    # The float estimate can be off by one either way; squares below stay under 2^32.
    a = jnp.where((a < U32(65536)) & (a * a < length), a + U32(1), a)
    a = jnp.where((a > U32(1)) & ((a - U32(1)) * (a - U32(1)) >= length), a - U32(1), a)
    a = jnp.maximum(a, U32(MIN_HALF))
    b = length // a + jnp.where(length % a != 0, U32(1), U32(0))
    return a, jnp.maximum(b, U32(MIN_HALF))


def levanter_right_bits(length: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
    """``rb = bits - bits // 2`` where ``2^bits`` is the next power of two ``>= length``."""
    bits = U32(32) - jax.lax.clz(jnp.maximum(length, U32(1)) - U32(1))
    bits = jnp.where(length <= 1, U32(0), bits)
    return bits - bits // U32(2)


INVALID = 0xFFFFFFFF  # the output for an index outside [0, length)


def masked_pass(network, x: UInt32[Array, "..."], length: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
    """One pass of ``network``: ``INVALID`` where ``x >= length``, 0 where ``length <= 1``."""
    valid = x < length
    y = jnp.where(length <= 1, U32(0), network(jnp.where(valid, x, U32(0))))
    return jnp.where(valid, y, U32(INVALID))


def _walks(
    y: UInt32[Array, "groups lanes"], x: UInt32[Array, "groups lanes"], bound: UInt32[Array, "..."]
) -> Bool[Array, "groups lanes"]:
    """Lanes still outside ``[0, bound)`` (a scalar or per-lane bound); out-of-range indices never walk."""
    return (y >= bound) & (x < bound)


def _dense_steps(network, y, x, bound, steps: int):
    for _ in range(steps):
        y = jnp.where(_walks(y, x, bound), network(y), y)
    return y


def _walk_dense(network, y, x, bound):
    body = partial(_dense_steps, network, x=x, bound=bound, steps=WALK_UNROLL)
    return jax.lax.while_loop(lambda y: jnp.any(_walks(y, x, bound)), body, y)


def cycle_walk(
    network: eqx.Module,
    x: UInt32[Array, " n"],
    length: UInt32[Array, "*n"],
    *,
    batched: bool,
) -> UInt32[Array, " n"]:
    """The network's permutation of ``[0, length)``, by cycle walking: apply it until in range.

    Lanes with ``x >= length`` give ``INVALID``; ``length <= 1`` gives 0. ``length`` is a scalar
    or one bound per lane. With ``batched=True`` every leaf of ``network`` carries a leading
    per-lane axis of size ``n``; otherwise the network is shared by all lanes.

    Lanes are laid out in groups of ``GROUP`` (XLA:CPU vectorises that for any ``n``, and a loop
    over an odd 1-D length not). One dense pass computes the network,
    the range masks and the output at once; dense steps continue while more than 1/``COMPACT_AT``
    of the groups hold a straggler; then only those groups are gathered and walked, recursively,
    so lanes that landed early do not pay for the slowest one. (A mixed-radix strong network
    leaves about ``n^-1/2`` of the lanes outside after one pass; Levanter's leaves up to 3/4.)
    """
    n = x.shape[0]
    groups = -(-n // GROUP)

    def lay_out(leaf, fill):
        fill = np.asarray(fill, leaf.dtype)
        leaf = jnp.pad(leaf, [(0, groups * GROUP - n)] + [(0, 0)] * (leaf.ndim - 1), constant_values=fill)
        return leaf.reshape(groups, GROUP, *leaf.shape[1:])

    # Padding lanes get index 0 (a valid start) and, with per-lane bounds, one nothing exceeds.
    lanes = {"length": lay_out(length, 0xFFFFFFFF) if jnp.ndim(length) else None, "x": lay_out(x, 0)}
    lanes["network"] = jax.tree.map(lambda leaf: lay_out(leaf, 1), network) if batched else None
    net, bound = _bind(network, lanes, length)
    # The range masks ride in the network's pass, so the walk's result is the output: no extra
    # pass over the lanes, no extra buffer.
    y = _walk_groups(network, lanes, masked_pass(net, lanes["x"], bound), length, depth=COMPACT_DEPTH)
    # The walk's while loops are fusion boundaries: this slice does not drag the network into an
    # odd-shaped loop.
    return y.reshape(-1)[:n]


def _bind(network, lanes, length):
    """The network and bound to use for these lanes (per-lane leaves when given)."""
    net = lanes["network"] if lanes["network"] is not None else network
    return net, length if lanes["length"] is None else lanes["length"]


def _walk_groups(network, lanes, y, length, *, depth: int):
    net, bound = _bind(network, lanes, length)
    x = lanes["x"]
    groups = y.shape[0]
    if depth == 0 or groups < 4 * COMPACT_AT:
        return _walk_dense(net, y, x, bound)
    capacity = max(groups // COMPACT_AT, 1)

    def flagged(y):
        flags = jnp.any(_walks(y, x, bound), axis=1)
        return flags, jnp.sum(flags, dtype=jnp.int32)

    def dense_step(carry):
        # WALK_UNROLL steps per flag pass: where many lanes walk (Levanter's domain can be 4x n),
        # flagging after every step costs more than the extra network evaluations.
        y = _dense_steps(net, carry[0], x, bound, steps=WALK_UNROLL)
        return y, *flagged(y)

    # Group flags are 1/GROUP of the data: counting them costs nothing beside the pass that
    # computes them, and the compaction below reuses them.
    y, flags, count = jax.lax.while_loop(lambda c: c[2] > capacity, dense_step, (y, *flagged(y)))

    def take(leaf, ids, fill):
        if leaf is None:
            return None
        return leaf.at[ids].get(mode="fill", fill_value=np.asarray(fill, leaf.dtype))

    def walk_flagged(carry):
        # At most ``capacity`` groups are flagged: one compaction gathers them all, and the
        # sub-walk returns only when each of its lanes has landed.
        y, count = carry
        ids = compact(flags, size=capacity)
        sub_lanes = {
            "length": take(lanes["length"], ids, 0xFFFFFFFF),
            "x": take(x, ids, 0),
            "network": jax.tree.map(lambda leaf: take(leaf, ids, 1), lanes["network"]),
        }
        # Fill groups hold y = 0, below any bound: they never walk.
        sub_y = _walk_groups(network, sub_lanes, take(y, ids, 0), length, depth=depth - 1)
        # count - count, not a constant 0: under shard_map the carry keeps its per-shard type.
        return y.at[ids].set(sub_y, mode="drop"), count - count

    # Runs once, or not at all when no lane walks (a loop, not a cond: XLA updates y in place).
    return jax.lax.while_loop(lambda c: c[1] > 0, walk_flagged, (y, count))[0]
