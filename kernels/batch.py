"""The batch every meshbatch dataset emits: fixed dtypes, one row per example.

A batch is a pytree of ``[batch, seq_len]`` int32 arrays, Levanter's ``LmExample`` without the
named axes:

    tokens      = [5, 6, 7, 8]
    loss_mask   = [1, 1, 1, 0]     # 1 where position i's next token is a training target
    segment_ids = [0, 0, 1, 1]     # attention never crosses a segment boundary

``doc_idx`` is carried only by datasets that know which document a row came from (splice), and
``labels`` only by batches a masked-LM build stage has masked (``ignore`` off the masked positions).
``positions`` and ``cu_seqlens`` (attention metadata) only by datasets asked for them (packed
examples: ``PackedDataset(..., attention_metadata=True)``).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int


class Batch(eqx.Module):
    """A batch of causal-LM examples.

    Attributes:
        tokens: ``int32[batch, seq_len]`` token ids.
        loss_mask: ``int32[batch, seq_len]``, 0/1; 1 where the next token is a target.
        segment_ids: ``int32[batch, seq_len]``; attention is causal within equal ids.
        doc_idx: ``int32[batch]`` source document per row, or ``None`` where the dataset has none.
        labels: ``int32[batch, seq_len]`` masked-LM targets, or ``None`` for causal LM.
        positions: ``int32[batch, seq_len]`` position of each token within its segment, or ``None``.
        cu_seqlens: ``int32[batch, max_segments + 1]`` each row's cumulative segment lengths
            (``[0, end_0, end_1, ...]``, the row's real tokens repeated past its last segment), or
            ``None``.
    """

    tokens: Int[Array, "batch seq"]
    loss_mask: Int[Array, "batch seq"]
    segment_ids: Int[Array, "batch seq"]
    doc_idx: Int[Array, " batch"] | None = None
    labels: Int[Array, "batch seq"] | None = None
    positions: Int[Array, "batch seq"] | None = None
    cu_seqlens: Int[Array, "batch segs1"] | None = None

    def __check_init__(self):
        for name in ("tokens", "loss_mask", "segment_ids", "labels", "positions"):
            value = getattr(self, name)
            if value is None:
                continue
            if value.dtype != jnp.int32:
                raise TypeError(f"Batch.{name} must be int32 (got dtype={value.dtype})")
            if value.shape != self.tokens.shape or value.ndim != 2:
                raise ValueError(
                    f"Batch.{name} must be [batch, seq_len] like tokens {self.tokens.shape} "
                    f"(got shape={value.shape})"
                )
        if self.doc_idx is not None:
            if self.doc_idx.dtype != jnp.int32:
                raise TypeError(f"Batch.doc_idx must be int32 (got dtype={self.doc_idx.dtype})")
            if self.doc_idx.shape != self.tokens.shape[:1]:
                raise ValueError(f"Batch.doc_idx must be [batch] (got shape={self.doc_idx.shape})")
        if self.cu_seqlens is not None:
            if self.cu_seqlens.dtype != jnp.int32:
                raise TypeError(f"Batch.cu_seqlens must be int32 (got dtype={self.cu_seqlens.dtype})")
            if self.cu_seqlens.ndim != 2 or self.cu_seqlens.shape[0] != self.tokens.shape[0]:
                raise ValueError(
                    f"Batch.cu_seqlens must be [batch, max_segments + 1] (got shape={self.cu_seqlens.shape})"
                )
