"""Running counts and stream compaction without ``cumsum``.

XLA:CPU lowers ``cumsum`` to a windowed reduction that runs at a few ns per element. A running
count of booleans is also a tree of small triangular matmuls (within blocks of 128, then across
the blocks' totals, recursively), and float32 is exact for it: every value is a small integer and
every partial sum an integer below 2^24.

    flags            = [1, 0, 1, 1, 0]
    running_count    = [1, 1, 2, 3, 3]
    compact(size=4)  = [0, 2, 3, 5]     # positions of the set flags, then the fill value n = 5
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float32, Int

SCAN_BLOCK = 128


def running_count(flags: Bool[Array, "rows n"]) -> Int[Array, "rows n"]:
    """Inclusive running count of ``True`` along the last axis, as int32 (exact)."""
    if flags.shape[-1] >= 2**24:
        return jnp.cumsum(flags.astype(jnp.int32), axis=-1, dtype=jnp.int32)
    return _running_sum(flags.astype(jnp.float32)).astype(jnp.int32)


def _running_sum(x: Float32[Array, "rows n"]) -> Float32[Array, "rows n"]:
    """Inclusive running sum of small non-negative integers whose total stays below 2^24.

    Within blocks of ``SCAN_BLOCK`` by one triangular matmul; the blocks' offsets by the same
    function on the block totals (a tree ``log_128(n)`` levels deep).
    """
    rows, n = x.shape
    block = min(SCAN_BLOCK, n)
    upper = jnp.triu(jnp.ones((block, block), jnp.float32))  # upper[i, j] = 1 where i <= j
    if n <= block:
        return jnp.matmul(x, upper, precision=jax.lax.Precision.HIGHEST)
    blocks = -(-n // block)
    x = jnp.pad(x, ((0, 0), (0, blocks * block - n))).reshape(rows * blocks, block)
    within = jnp.matmul(x, upper, precision=jax.lax.Precision.HIGHEST).reshape(rows, blocks, block)
    totals = within[..., -1]
    offsets = _running_sum(totals) - totals  # exclusive: what the earlier blocks hold
    return (within + offsets[..., None]).reshape(rows, blocks * block)[:, :n]


def compact(flags: Bool[Array, " n"], *, size: int) -> Int[Array, " size"]:
    """``jnp.nonzero(flags, size=size, fill_value=n)[0]``, faster on CPU (see module docstring)."""
    n = flags.shape[0]
    slot = jnp.where(flags, running_count(flags[None, :])[0] - 1, size)
    return jnp.full((size,), n, jnp.int32).at[slot].set(jnp.arange(n, dtype=jnp.int32), mode="drop")
