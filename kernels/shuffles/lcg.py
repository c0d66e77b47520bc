"""The linear permutation ``p(x) = (a x + b) mod n`` with ``gcd(a, n) = 1``, in uint32.

Levanter's ``LcgPermutation`` computes ``a * x`` in uint64; here the product is reduced modulo
``n`` by double-and-add over the 32 bits of ``x`` (``uint32.mul_mod``), every intermediate kept
below ``n < 2^32``:

    n = 10, a = 3, b = 7:  x = 0..9  ->  7, 0, 3, 6, 9, 2, 5, 8, 1, 4
"""

from __future__ import annotations

import equinox as eqx
from jaxtyping import Array, UInt32

from ..uint32 import add_mod, mul_mod


class LinearNetwork(eqx.Module):
    """``x -> (a x + b) mod length``; arrays broadcast against the indices."""

    a: UInt32[Array, "..."]
    b: UInt32[Array, "..."]
    length: UInt32[Array, "..."]

    def __call__(self, x: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
        return add_mod(mul_mod(self.a, x, self.length), self.b, self.length)
