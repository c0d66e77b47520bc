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
from jaxtyping import Array, Float32, UInt32

U32 = jnp.uint32
LEVANTER_ROUNDS = 5
LEVANTER_MULTIPLIER = 2654435761
STRONG_ROUNDS = 6
MIN_HALF = 16
# Cycle-walk steps fused into one pass over the data before the loop re-checks for stragglers.
WALK_UNROLL = 2
# Straggler compaction: lanes per block, and the smallest input worth compacting.
BLOCK = 64
COMPACT_MIN_LANES = 1 << 14
# Dense steps continue while more than 1 lane in DENSE_UNTIL is outside: sparser than that, few
# blocks hold a straggler (1 - (1 - 1/512)^64 ~ 12%) and compaction pays off.
DENSE_UNTIL = 512


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


def _fmix32(h: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
    h = h ^ (h >> 16)
    h = h * U32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * U32(0xC2B2AE35)
    return h ^ (h >> 16)


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
        for i in range(self.keys.shape[-1]):
            s = left + _scale(_fmix32(right ^ self.keys[..., i]), a)
            left, right = right, jnp.where(s >= a, s - a, s)  # new left < b, new right < a
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


def _dense_steps(network, y, length, steps: int):
    for _ in range(steps):
        y = jnp.where(y >= length, network(y), y)
    return y


def _walk_dense(network, y, length):
    body = partial(_dense_steps, network, length=length, steps=WALK_UNROLL)
    return jax.lax.while_loop(lambda y: jnp.any(y >= length), body, y)


def cycle_walk(
    network: eqx.Module,
    x: UInt32[Array, " n"],
    length: UInt32[Array, "*n"],
    *,
    batched: bool,
) -> UInt32[Array, " n"]:
    """Apply ``network`` to ``x`` until every value lies in ``[0, length)``.

    ``x`` must lie in ``[0, length)``. With ``batched=True`` every leaf of ``network`` and
    ``length`` carries a leading per-lane axis of size ``n``; otherwise they are shared by all lanes.

    A dense pass handles the bulk. While more than 1/``DENSE_UNTIL`` of the lanes are still
    outside, dense steps continue; then only the ``BLOCK``-lane blocks that still hold a straggler
    are gathered and walked, so lanes that landed early do not pay for the slowest one. (A
    mixed-radix strong network leaves about ``n^-1/2`` of the lanes outside after one pass;
    Levanter's leaves up to 3/4.)
    """
    y = network(x)
    n = x.shape[0]
    if n < COMPACT_MIN_LANES:
        return _walk_dense(network, y, length)

    def crowded(y):
        return jnp.sum(y >= length, dtype=jnp.int32) > n // DENSE_UNTIL

    y = jax.lax.while_loop(crowded, partial(_dense_steps, network, length=length, steps=1), y)

    num_blocks = -(-n // BLOCK)
    pad = num_blocks * BLOCK - n
    capacity = max(num_blocks // 8, 1)

    def blocked(leaf, fill):
        leaf = jnp.pad(leaf, [(0, pad)] + [(0, 0)] * (leaf.ndim - 1), constant_values=fill)
        return leaf.reshape(num_blocks, BLOCK, *leaf.shape[1:])

    # Padding and fill lanes hold y = 0 < length = 1, so they never count as stragglers.
    y_blocks = blocked(y, 0)
    len_blocks = blocked(jnp.broadcast_to(length, (n,)), 1)
    lane_net = jax.tree.map(lambda leaf: blocked(leaf, 1), network) if batched else network

    def take(leaf, ids, fill):
        return leaf.at[ids].get(mode="fill", fill_value=fill)

    def walk_flagged(carry):
        y_blocks, flags = carry
        ids = jnp.nonzero(flags, size=capacity, fill_value=num_blocks)[0]
        sub_net = jax.tree.map(lambda leaf: take(leaf, ids, 1), lane_net) if batched else network
        sub_y = _walk_dense(sub_net, take(y_blocks, ids, 0), take(len_blocks, ids, 1))
        return y_blocks.at[ids].set(sub_y, mode="drop"), flags.at[ids].set(False, mode="drop")

    flags = jnp.any(y_blocks >= len_blocks, axis=1)
    y_blocks, _ = jax.lax.while_loop(lambda c: jnp.any(c[1]), walk_flagged, (y_blocks, flags))
    return y_blocks.reshape(-1)[:n]
