"""The row order of a merge's picks: the stable order of ``(key, hash)``, in one sort when it can.

``select_merge`` knows which ``n`` candidates are picked; their rows go out in the order of
``(key, tie hash)``, ties in pick order (a source's own rows, then sources in index order). Two
ways, equal by construction:

* ``radix_order``: a least-significant-digit radix sort of the 64-bit ``key * 2^32 + hash``
  whose passes are single-array sorts of ``digit * 2^b + place`` (``b`` bits hold a place; on
  XLA:CPU a single-array sort of 4096 words takes about 125 us, one with a payload array about
  five times that): three passes for keys under ``2^28``, each pass skipped when its digits are
  all equal. Always exact.
* ``run_order`` (the fast path): while the picks' keys span less than ``2^(32 - b)``, one sort
  of ``(key - least) * 2^b + place`` orders them by key; rows tied at a key then stand next to
  each other, in pick order, and each is moved inside its run to its rank by ``(hash, place)``,
  counted against its neighbours up to ``RUN - 1`` away (elementwise, no sort). Exact while no
  run is longer than ``RUN`` (checked); otherwise, or when the keys span too much, the radix
  sort decides (``lax.cond``: one runs). Rows of different real lengths tie rarely (runs of one
  or two), rows of equal length tie at every level (runs as long as the number of sources):
  those take the radix sort.

A run of three at key 7 whose hashes are ``9, 2, 5`` in pick order (places ``p, p+1, p+2``):
ranks by hash ``2, 0, 1``, so the rows go out as ``p+1, p+2, p``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, UInt32

U32 = jnp.uint32
RUN = 4  # the longest run of tied keys the fast path orders


def radix_order(key: UInt32[Array, " n"], hashes: UInt32[Array, " n"]) -> UInt32[Array, " n"]:
    """The stable order of ``(key, hashes)`` by single-array radix passes (always exact)."""
    n = key.shape[0]
    bits = max(1, (n - 1).bit_length())
    width = 32 - bits
    place = jnp.arange(n, dtype=U32)
    order = place
    for low in range(0, 64, width):
        if low + width <= 32:
            digit = hashes >> low
        elif low >= 32:
            digit = key >> (low - 32)
        else:
            digit = (hashes >> low) | (key << (32 - low))
        digit = digit & U32((1 << width) - 1)

        def sort_by(order, digit=digit):
            return order[jax.lax.sort((digit[order] << bits) | place) & U32((1 << bits) - 1)]

        order = jax.lax.cond(jnp.min(digit) == jnp.max(digit), lambda order: order, sort_by, order)
    return order


def _pass(order: UInt32[Array, " n"], digit: UInt32[Array, " n"], bits: int) -> UInt32[Array, " n"]:
    """``order`` stably sorted by ``digit[order]`` (digits under ``2^(32 - bits)``)."""
    place = jnp.arange(order.shape[0], dtype=U32)
    return order[jax.lax.sort((digit[order] << bits) | place) & U32((1 << bits) - 1)]


def two_pass_order(key: UInt32[Array, " n"], hashes: UInt32[Array, " n"]) -> UInt32[Array, " n"]:
    """The stable order of ``(key, hashes)``: two sorts when the keys span under ``2^(32 - b)``
    and the high ``32 - b`` bits of the hash tell every tie at a key apart; else
    ``radix_order``."""
    n = key.shape[0]
    bits = max(1, (n - 1).bit_length())
    least = jnp.min(key)

    def two_sorts(_):
        order = _pass(jnp.arange(n, dtype=U32), hashes >> bits, bits)
        order = _pass(order, key - least, bits)
        sk, sh = key[order], hashes[order]
        # rows tied at a key and at the hash's high bits stand together: they must hash alike
        blurred = (sk[1:] == sk[:-1]) & ((sh[1:] >> bits) == (sh[:-1] >> bits)) & (sh[1:] != sh[:-1])
        return jax.lax.cond(jnp.any(blurred), lambda: radix_order(key, hashes), lambda: order)

    fits = (jnp.max(key) - least) < U32(1 << (32 - bits)) if bits < 32 else jnp.asarray(False)
    return jax.lax.cond(fits, two_sorts, lambda _: radix_order(key, hashes), None)
