"""Levanter drop-ins: ``AsyncDataset`` classes named as in the seeds, built by meshbatch kernels.

The only module that imports levanter and haliax. Each ``get_batch(indices)`` builds all
requested rows in one jitted call and hands Levanter's ``DataLoader`` the ``LmExample``s it
expects (``tokens``, int32 ``loss_mask``, ``AttentionMask.causal().with_segment_ids(...)``):

    dataset = MultiSpliceDocumentDataset(Pos=Pos, doc_tokens_list=docs, pad_token_id=0,
                                         content_start_mode="coverage_balanced", alpha=0.8)
    loader = DataLoader(dataset, batch_size, mesh=mesh, axis_resources={"batch": "data"})

For the fastest path skip the per-example handoff: ``meshbatch.Pipeline`` yields global sharded
batches directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray
from levanter.data.dataset import AsyncDataset
from levanter.layers.attention import AttentionMask
from levanter.models.lm_model import LmExample

from meshbatch.kernels import Batch

from .datasets.splice_indexed import SpliceDataset
from .shuffle import block_shuffle

T = TypeVar("T")


def lm_examples(batch: Batch, Pos: hax.Axis) -> list[LmExample]:
    """One Levanter ``LmExample`` per row of ``batch`` (segment ids as an attention mask)."""
    if batch.tokens.shape[1] != Pos.size:
        raise ValueError(f"batch rows have {batch.tokens.shape[1]} tokens, Pos.size={Pos.size}")
    tokens, loss_mask, segments = (np.asarray(x) for x in (batch.tokens, batch.loss_mask, batch.segment_ids))
    out = []
    for row in range(tokens.shape[0]):
        segment_ids = hax.named(jnp.asarray(segments[row]), Pos)
        out.append(
            LmExample(
                tokens=hax.named(jnp.asarray(tokens[row]), Pos),
                loss_mask=hax.named(jnp.asarray(loss_mask[row]), Pos),
                attn_mask=AttentionMask.causal().with_segment_ids(segment_ids),
            )
        )
    return out


class MultiSpliceDocumentDataset(AsyncDataset[LmExample]):
    """The seed's multi-document splice dataset (every ``SpliceSpec`` field by keyword).

    Args:
        Pos: the model's position axis; its size is the frame length.
        doc_tokens_list: 1-D integer token arrays.
        pad_token_id: filler token.
        epochs: epochs in the dataset's length (``None``: one epoch; indices past it still wrap).
        **spec: ``SpliceSpec`` fields (``content_length``, ``content_start_mode``, ``alpha``, ...).
    """

    def __init__(
        self,
        *,
        Pos: hax.Axis,
        doc_tokens_list: Sequence[np.ndarray],
        pad_token_id: int,
        epochs: int | None = None,
        **spec,
    ):
        super().__init__()
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
            raise ValueError(f"epochs must be a positive int or None (got epochs={epochs!r})")
        self.Pos = Pos
        self.splice = SpliceDataset(doc_tokens_list, seq_len=Pos.size, pad_token_id=pad_token_id, **spec)
        self.epochs = 1 if epochs is None else epochs

    async def async_len(self) -> int:
        return len(self.splice) * self.epochs

    async def final_length_is_known(self) -> bool:
        return True

    def is_finite(self) -> bool:
        return True

    async def current_len(self) -> int:
        return await self.async_len()

    async def get_batch(self, indices: Sequence[int]) -> Sequence[LmExample]:
        return lm_examples(self.splice.get_batch(np.asarray(indices, dtype=np.int64)), self.Pos)


class SpliceDocumentDataset(MultiSpliceDocumentDataset):
    """The seed's single-document splice dataset: ``MultiSpliceDocumentDataset`` of one document."""

    def __init__(self, *, Pos: hax.Axis, doc_tokens: np.ndarray, pad_token_id: int, **spec):
        super().__init__(Pos=Pos, doc_tokens_list=[doc_tokens], pad_token_id=pad_token_id, **spec)


class BlockShufflingDataset(AsyncDataset[T]):
    """marin's ``BlockShufflingDataset``: the same order (``compat="levanter"``, the default), or
    the strong default with ``compat=None``; every batch's indices mapped in one jitted call.
    """

    def __init__(
        self,
        dataset: AsyncDataset[T],
        io_block_size: int,
        *,
        window_blocks: int,
        key: PRNGKeyArray | int,
        perm_type: str = "feistel",
        compat: str | None = "levanter",
    ):
        super().__init__()
        if not dataset.is_finite():
            raise ValueError("BlockShufflingDataset only supports finite datasets")
        self.dataset = dataset
        self.key = jax.random.PRNGKey(key) if isinstance(key, int) else key
        self.io_block_size, self.window_blocks = io_block_size, window_blocks
        self.perm_type, self.compat = perm_type, compat
        self._shuffle = None

    async def _get_shuffle(self):
        if self._shuffle is None:
            self._shuffle = block_shuffle(
                await self.dataset.async_len(),
                io_block_size=self.io_block_size,
                window_blocks=self.window_blocks,
                key=self.key,
                kind=self.perm_type,
                compat=self.compat,
            )
        return self._shuffle

    async def async_len(self) -> int:
        return await self.dataset.async_len()

    async def final_length_is_known(self) -> bool:
        return await self.dataset.final_length_is_known()

    def is_finite(self) -> bool:
        return True

    async def current_len(self) -> int | None:
        return await self.dataset.current_len()

    async def get_batch(self, indices: Sequence[int]) -> Sequence[T]:
        if len(indices) == 0:
            return []
        shuffle = await self._get_shuffle()
        mapped = np.asarray(shuffle(np.asarray(indices, dtype=np.int64)))
        return await self.dataset.get_batch([int(i) for i in mapped])

    async def getitem_async(self, index: int) -> T:
        return (await self.get_batch([index]))[0]
