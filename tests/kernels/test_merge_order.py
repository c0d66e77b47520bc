"""The merge's row order (``benchmarks/select_merge.py``): both ways equal the stable order of
(key, hash) (numpy's lexsort)."""

import jax
import numpy as np
import pytest
from interleave_reference import merge

radix, two_pass = jax.jit(merge.radix_order), jax.jit(merge.two_pass_order)


@pytest.mark.parametrize("n", [1, 2, 9, 4096])
def test_orders_equal_lexsort(n):
    """Keys from a few values (long runs of ties) to 2^31 (past the two-sort span), hashes from
    two values (ties broken by place) to all 32 bits, and hashes equal in their high bits with
    different low bits (the two sorts' check sends those to the radix sort)."""
    rng = np.random.default_rng(n)
    for trial in range(12):
        span = (3, 50, 2**17, 2**31)[trial % 4]
        key = rng.integers(0, span, n).astype(np.uint32)
        hashes = rng.integers(0, (2, 2**32, 2**32, 2**32)[trial // 3 % 4], n, dtype=np.uint64)
        hashes = hashes.astype(np.uint32)
        if trial % 3 == 2:
            hashes &= np.uint32(0xFFFFF003)  # ties in the high bits, told apart by the low ones
        want = np.lexsort((np.arange(n), hashes, key))
        np.testing.assert_array_equal(np.asarray(radix(key, hashes)), want)
        np.testing.assert_array_equal(np.asarray(two_pass(key, hashes)), want)


def test_docstring_trace():
    """Keys 5 3 5 3, hashes 9 7 2 7: key 3 (equal hashes: places in order), then key 5 (2 < 9)."""
    key, hashes = np.asarray([5, 3, 5, 3], np.uint32), np.asarray([9, 7, 2, 7], np.uint32)
    assert np.asarray(two_pass(key, hashes)).tolist() == [1, 3, 2, 0]
    assert np.asarray(radix(key, hashes)).tolist() == [1, 3, 2, 0]
