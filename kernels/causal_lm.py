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
from jaxtyping import Array, Int

from .batch import Batch
from .scan import running_count


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


def gather_windows(
    tokens: Int[Array, " buffer"], starts: Int[Array, " rows"], *, width: int
) -> Int[Array, "rows width"]:
    """Rows ``tokens[starts[r] : starts[r] + width]`` of a flat buffer: a batched ``dynamic_slice``
    (a contiguous copy per row, no per-token index arithmetic). Starts must keep every row inside
    the buffer."""
    return jax.vmap(lambda start: jax.lax.dynamic_slice(tokens, (start,), (width,)))(starts)
