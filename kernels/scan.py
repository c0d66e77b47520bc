"""Running counts and stream compaction without ``cumsum``.

XLA:CPU lowers ``cumsum`` to a windowed reduction that runs at a few ns per element. A running
count of booleans is cheaper with bit tricks: pack each 32 flags into a word, count each word's
set bits below every position with ``population_count`` (elementwise), and add the running total
of the words' counts (a 32x shorter running sum, done as a tree of small triangular matmuls,
exact in float32 because every partial sum is an integer below 2^24).

    flags            = [1, 0, 1, 1, 0]
    running_count    = [1, 1, 2, 3, 3]
    compact(size=4)  = [0, 2, 3, 5]     # positions of the set flags, then the fill value n = 5
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float32, Int, UInt32

SCAN_BLOCK = 128
WORD = 32
U32 = jnp.uint32
_POSITION = np.arange(WORD, dtype=np.uint32)[None, None, :]  # bit positions: [rows, words, WORD]


def _pack(flags: Bool[Array, "rows n"]) -> UInt32[Array, "rows words"]:
    """Each 32 flags as the bits of one word (bit i is flag 32 w + i); the tail pads with 0."""
    rows, n = flags.shape
    words = -(-n // WORD)
    bits = jnp.pad(flags, ((0, 0), (0, words * WORD - n))).reshape(rows, words, WORD)
    # Distinct powers of two: the sum is the bitwise or, exactly.
    return jnp.sum(bits.astype(U32) << _POSITION, axis=-1, dtype=U32)


def running_count(flags: Bool[Array, "rows n"]) -> Int[Array, "rows n"]:
    """Inclusive running count of ``True`` along the last axis, as int32 (exact)."""
    rows, n = flags.shape
    packed = _pack(flags)
    counts = jax.lax.population_count(packed).astype(jnp.int32)
    if n >= 2**24:  # float32 partial sums would no longer be exact
        before = jnp.cumsum(counts, axis=-1, dtype=jnp.int32) - counts
    else:
        before = _running_sum(counts.astype(jnp.float32)).astype(jnp.int32) - counts
    # Set bits at or below each position i: mask (2 << i) - 1 (2 << 31 wraps to 0: all ones).
    at_or_below = (U32(2) << _POSITION) - U32(1)
    within = jax.lax.population_count(packed[..., None] & at_or_below).astype(jnp.int32)
    return (before[..., None] + within).reshape(rows, -1)[:, :n]


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
