"""The linear permutation ``p(x) = (a x + b) mod n`` with ``gcd(a, n) = 1``, in uint32.

Levanter's ``LcgPermutation`` computes ``a * x`` in uint64; here the product is reduced modulo
``n`` by double-and-add over the 32 bits of ``x``, every intermediate kept below ``n < 2^32``:

    n = 10, a = 3, b = 7:  x = 0..9  ->  7, 0, 3, 6, 9, 2, 5, 8, 1, 4
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, UInt32

U32 = jnp.uint32


def add_mod(x: UInt32[Array, "..."], y: UInt32[Array, "..."], n: UInt32[Array, "..."]):
    """``(x + y) mod n`` for ``x, y < n`` without overflowing uint32."""
    return jnp.where(x >= n - y, x - (n - y), x + y)


def mul_mod(a: UInt32[Array, "..."], x: UInt32[Array, "..."], n: UInt32[Array, "..."]):
    """``(a * x) mod n`` for ``a, x < n < 2^32``, most significant bit of ``x`` first."""
    acc = jnp.zeros(jnp.broadcast_shapes(jnp.shape(a), jnp.shape(x), jnp.shape(n)), U32)
    for bit in range(31, -1, -1):
        acc = add_mod(acc, acc, n)
        acc = jnp.where(((x >> bit) & U32(1)) == 1, add_mod(acc, a, n), acc)
    return acc


class LinearNetwork(eqx.Module):
    """``x -> (a x + b) mod length``; arrays broadcast against the indices."""

    a: UInt32[Array, "..."]
    b: UInt32[Array, "..."]
    length: UInt32[Array, "..."]

    def __call__(self, x: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
        return add_mod(mul_mod(self.a, x, self.length), self.b, self.length)
