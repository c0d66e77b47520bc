"""Wide and modular uint32 arithmetic, and the uint32 hash: the kernels' one home for both.

Kernels never enable ``jax_enable_x64``, so a 64-bit product is two uint32 words built from
16-bit limbs, and a modular product never leaves ``[0, n)``. A worked trace:

    mul_wide(0xFFFFFFFF, 0xFFFFFFFF)  -> (lo=0x00000001, hi=0xFFFFFFFE)   # (2^32 - 1)^2
    mulhi(0x80000000, 10)             -> 5                                 # floor(2^31 * 10 / 2^32)
    muldiv(3_000_000_000, 3, 1, 4)    -> 2_250_000_000                     # floor((9e9 + 1) / 4)
    ceil_div(2^32 - 1, 2)             -> 2^31                              # no a + b - 1 overflow
    add_mod(7, 8, 10) -> 5;  mul_mod(3, 9, 10) -> 7
    fmix32(0) -> 0;  fmix32(1) -> 0x514E28B7                               # murmur3's finaliser

Every function is elementwise over broadcastable uint32 arrays and exact for its stated range.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, UInt32

U32 = jnp.uint32
_MASK16 = 0xFFFF


def mul_wide(
    x: UInt32[Array, "*a"], y: UInt32[Array, "*b"]
) -> tuple[UInt32[Array, "..."], UInt32[Array, "..."]]:
    """The full 64-bit product ``x * y`` as ``(low word, high word)``."""
    x0, x1 = x & U32(_MASK16), x >> 16
    y0, y1 = y & U32(_MASK16), y >> 16
    p00, p01, p10, p11 = x0 * y0, x0 * y1, x1 * y0, x1 * y1
    mid = (p00 >> 16) + (p01 & U32(_MASK16)) + (p10 & U32(_MASK16))
    lo = (p00 & U32(_MASK16)) | (mid << 16)
    hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    return lo, hi


def mulhi(x: UInt32[Array, "*a"], y: UInt32[Array, "*b"]) -> UInt32[Array, "..."]:
    """``floor(x * y / 2^32)``: the high word of the product (Lemire's range reduction)."""
    return mul_wide(x, y)[1]


def muldiv(
    a: UInt32[Array, "*a"], b: UInt32[Array, "*b"], add: UInt32[Array, "*c"], c: UInt32[Array, "*d"]
) -> UInt32[Array, "..."]:
    """Exact ``floor((a * b + add) / c)`` for quotients below ``2^32`` (``c > 0``).

    The 64-bit numerator is ``mul_wide`` plus ``add`` with its carry; the division is 32 steps of
    restoring long division, all elementwise.
    """
    low, high = mul_wide(a, b)
    low2 = low + add
    rem = high + (low2 < low).astype(U32)  # < c when the quotient fits 32 bits
    quotient = jnp.zeros_like(low2)
    for bit in range(31, -1, -1):
        top = rem >> 31
        rem = (rem << 1) | ((low2 >> bit) & U32(1))
        take = (top > 0) | (rem >= c)
        rem = jnp.where(take, rem - c, rem)
        quotient = quotient | (take.astype(U32) << bit)
    return quotient


def ceil_div(a: UInt32[Array, "*a"], b: UInt32[Array, "*b"]) -> UInt32[Array, "..."]:
    """``ceil(a / b)`` without the ``a + b - 1`` that overflows near ``2^32``."""
    return a // b + (a % b != 0).astype(U32)


def add_mod(x: UInt32[Array, "*a"], y: UInt32[Array, "*b"], n: UInt32[Array, "*c"]) -> UInt32[Array, "..."]:
    """``(x + y) mod n`` for ``x, y < n`` without overflowing uint32."""
    return jnp.where(x >= n - y, x - (n - y), x + y)


def mul_mod(a: UInt32[Array, "*a"], x: UInt32[Array, "*b"], n: UInt32[Array, "*c"]) -> UInt32[Array, "..."]:
    """``(a * x) mod n`` for ``a, x < n < 2^32``: double-and-add, most significant bit of ``x``
    first, every intermediate below ``n``."""
    acc = jnp.zeros(jnp.broadcast_shapes(jnp.shape(a), jnp.shape(x), jnp.shape(n)), U32)
    for bit in range(31, -1, -1):
        acc = add_mod(acc, acc, n)
        acc = jnp.where(((x >> bit) & U32(1)) == 1, add_mod(acc, a, n), acc)
    return acc


def fmix32(h: UInt32[Array, "*a"]) -> UInt32[Array, "*a"]:
    """murmur3's 32-bit finaliser: a bijection of uint32 with full avalanche (every input bit
    flips each output bit with probability ~1/2)."""
    h = h ^ (h >> 16)
    h = h * U32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * U32(0xC2B2AE35)
    return h ^ (h >> 16)
