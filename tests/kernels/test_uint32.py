"""meshbatch.kernels.uint32: the wide and modular uint32 helpers against Python integers, and the
module docstring's worked trace."""

import jax.numpy as jnp
import numpy as np
import pytest
import reference

from meshbatch.kernels.uint32 import add_mod, ceil_div, fmix32, mul_mod, mul_wide, muldiv, mulhi

U32 = jnp.uint32
M = 2**32
EDGES = [0, 1, 2, 3, 0xFFFF, 0x10000, 2**31 - 1, 2**31, M - 2, M - 1]


def _words(n: int, seed: int) -> np.ndarray:
    """``n`` random uint32 words and every pair of edge values (as two aligned columns)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(0, M, n, dtype=np.uint64), np.array(EDGES, np.uint64)])


def _u32(x) -> jnp.ndarray:
    return jnp.asarray(np.asarray(x, np.uint64).astype(np.uint32))


def test_the_worked_trace():
    lo, hi = mul_wide(U32(M - 1), U32(M - 1))
    assert (int(lo), int(hi)) == (1, 0xFFFFFFFE)
    assert int(mulhi(U32(0x80000000), U32(10))) == 5
    assert int(muldiv(U32(3_000_000_000), U32(3), U32(1), U32(4))) == 2_250_000_000
    assert int(ceil_div(U32(M - 1), U32(2))) == 2**31
    assert int(add_mod(U32(7), U32(8), U32(10))) == 5 and int(mul_mod(U32(3), U32(9), U32(10))) == 7
    assert int(fmix32(U32(0))) == 0 and int(fmix32(U32(1))) == 0x514E28B7


def test_mul_wide_and_mulhi_are_the_exact_product():
    x = _words(3000, 0)
    y = np.concatenate([_words(3000, 1)[:3000], np.array(EDGES[::-1], np.uint64)])
    lo, hi = (np.asarray(w).astype(np.uint64) for w in mul_wide(_u32(x), _u32(y)))
    want = [int(a) * int(b) for a, b in zip(x, y, strict=True)]
    assert [int(h) * M + int(low) for h, low in zip(hi, lo, strict=True)] == want
    np.testing.assert_array_equal(np.asarray(mulhi(_u32(x), _u32(y))), hi)


def test_ceil_div_never_overflows():
    a, b = _words(3000, 2), np.maximum(_words(3000, 3), 1)
    want = [-(-int(p) // int(q)) for p, q in zip(a, b, strict=True)]
    assert np.asarray(ceil_div(_u32(a), _u32(b))).tolist() == want


@pytest.mark.parametrize("n", [1, 2, 3, 10, 2**16 + 1, 2**31 + 11, M - 1])
def test_modular_add_and_multiply_stay_below_n(n):
    rng = np.random.default_rng(n)
    x, y = rng.integers(0, n, 2000, dtype=np.uint64), rng.integers(0, n, 2000, dtype=np.uint64)
    x[:2], y[:2] = n - 1, [n - 1, 0]
    nn = _u32(np.full(x.shape, n, np.uint64))
    assert np.asarray(add_mod(_u32(x), _u32(y), nn)).tolist() == [
        (int(a) + int(b)) % n for a, b in zip(x, y, strict=True)
    ]
    assert np.asarray(mul_mod(_u32(x), _u32(y), nn)).tolist() == [
        (int(a) * int(b)) % n for a, b in zip(x, y, strict=True)
    ]


def test_fmix32_is_murmur3s_finaliser_and_a_bijection():
    x = _words(2000, 4)
    assert np.asarray(fmix32(_u32(x))).tolist() == [reference.fmix32(int(v)) for v in x]
    low = np.asarray(fmix32(jnp.arange(1 << 16, dtype=U32)))
    assert np.unique(low).size == 1 << 16
