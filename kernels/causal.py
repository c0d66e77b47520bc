"""Causal-LM rows from token windows: Levanter's ``LmExample.causal`` semantics, batched.

For each row of ``seq_len`` tokens:

* ``loss_mask[i] = 1`` except the last position (nothing to predict after it), and except where
  the next token is ``ignore_id``;
* ``segment_ids[i]`` = number of ``eos_id`` tokens strictly before ``i`` (a new document starts
  after each EOS), so attention never crosses a document boundary.

    tokens      = [5, 6, 2, 7, 8]      eos_id = 2, ignore_id = 8
    loss_mask   = [1, 1, 1, 0, 0]      # position 3 predicts the ignored 8; position 4 is last
    segment_ids = [0, 0, 0, 1, 1]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from .batch import Batch


def causal_lm_batch(
    tokens: Int[Array, "rows seq"], *, eos_id: int | None = None, ignore_id: int | None = None
) -> Batch:
    """Builds a ``Batch`` from ``[rows, seq_len]`` windows of tokens (any integer dtype).

    Args:
        tokens: the token windows; cast to int32.
        eos_id: token that ends a document; ``None`` keeps one segment per row.
        ignore_id: token never used as a target; ``None`` masks only the last position.

    Returns:
        ``Batch`` with int32 ``tokens``, ``loss_mask`` and ``segment_ids`` of shape ``[rows, seq_len]``.
    """
    tokens = tokens.astype(jnp.int32)
    seq_len = tokens.shape[-1]
    position = jnp.arange(seq_len, dtype=jnp.int32)[None, :]
    loss_mask = jnp.broadcast_to(position < seq_len - 1, tokens.shape)
    if ignore_id is not None:
        # Levanter rolls the row left; the wrapped last position is masked anyway.
        next_token = jnp.roll(tokens, -1, axis=-1)
        loss_mask = loss_mask & (next_token != ignore_id)
    if eos_id is not None:
        follows_eos = (jnp.roll(tokens, 1, axis=-1) == eos_id) & (position > 0)
        segment_ids = running_count(follows_eos)
    else:
        segment_ids = jnp.zeros_like(tokens)
    return Batch(tokens=tokens, loss_mask=loss_mask.astype(jnp.int32), segment_ids=segment_ids)


SCAN_BLOCK = 128


def running_count(flags: Bool[Array, "rows seq"]) -> Int[Array, "rows seq"]:
    """Inclusive running count of ``True`` along the last axis, as int32.

    ``cumsum`` lowers to a slow windowed reduction on CPU; two small triangular matmuls (within
    blocks of ``SCAN_BLOCK``, then across blocks) compute the same integers exactly: every
    product is 0 or 1 and every partial sum an integer below 2^24, so float32 cannot round.
    """
    rows, seq_len = flags.shape
    if seq_len >= 2**24:
        return jnp.cumsum(flags.astype(jnp.int32), axis=-1, dtype=jnp.int32)
    block = min(SCAN_BLOCK, seq_len)
    blocks = -(-seq_len // block)
    x = jnp.pad(flags.astype(jnp.float32), ((0, 0), (0, blocks * block - seq_len)))
    x = x.reshape(rows, blocks, block)
    upper = jnp.triu(jnp.ones((block, block), jnp.float32))  # upper[i, j] = 1 where i <= j
    within = jnp.matmul(x, upper, precision=jax.lax.Precision.HIGHEST)
    before = jnp.triu(jnp.ones((blocks, blocks), jnp.float32), k=1)  # blocks strictly earlier
    offsets = jnp.matmul(within[..., -1], before, precision=jax.lax.Precision.HIGHEST)
    counts = within + offsets[..., None]
    return counts.reshape(rows, blocks * block)[:, :seq_len].astype(jnp.int32)
