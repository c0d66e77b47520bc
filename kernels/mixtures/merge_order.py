"""The row order of a merge's picks: the stable order of ``(key, hash)``, in two sorts when it can.

``select_merge`` knows which ``n`` candidates are picked; their rows go out in the order of
``(key, tie hash)``, ties in pick order (a source's own rows, then sources in index order). On
XLA:CPU a single-array sort of 4096 words takes about 60 to 130 us and one with a payload array
about five times that, so both ways below sort single arrays of ``digit * 2^b + place`` (``b``
bits hold a place) and read the order from the low bits; they are equal by construction:

* ``radix_order``: a least-significant-digit radix sort of the 64-bit ``key * 2^32 + hash``,
  ``32 - b`` bits a pass (three passes for keys under ``2^28``; a pass whose digits are all equal
  is skipped). Always exact.
* ``two_pass_order``: while the keys span under ``2^(32 - b)``, one pass by the hash's high
  ``32 - b`` bits, then one by ``key - least``: the order by ``(key, hash >> b, place)``. That is
  the order by ``(key, hash, place)`` unless two rows tied at a key share the hash's high bits
  and differ in its low ones; they then stand next to each other, which is checked, and the
  radix sort decides (``lax.cond``: one runs), as it does when the keys span too much.

Four picks with keys ``5 3 5 3`` and hashes ``9 7 2 7`` (places 0 .. 3): by the hash, places
``2 1 3 0``; then by the key (stable), ``1 3 2 0``: key 3 (hashes 7, 7: places in order), then
key 5 (hash 2 before 9).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, UInt32

U32 = jnp.uint32


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
