"""The device half of a ``BlockDataset``: block order, legacy packing tables, the block build.

Each row's plan, and what build does with it::

    preblocked: example b -> source by ``source_start``, block within it -> BlockPlan(block)
    legacy:     example b -> packed block p -> its pieces (entries first[p] .. first[p] + count[p])
                -> PiecesPlan(entry, row_start, slot_start, slots, size), [n, spans_per_row] each
    build:      gather_windows (preblocked) or assemble_rows (legacy), then block_batch
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int

from meshbatch.datasets.protocol import Content, DeviceDataset, Plan, Rows
from meshbatch.kernels import Batch, assemble_rows, block_batch, gather_windows
from meshbatch.shuffles.shuffle_spec import ShuffleSpec


class BlockPlan(eqx.Module):
    """A preblocked row's plan detail: the block within its source."""

    block: Int[Array, " n"]


class PiecesPlan(eqx.Module):
    """A legacy row's plan detail: its packed block's document pieces, ``[n, spans_per_row]``
    each (entry, where the piece starts in the row and in the document's slots, its slots, the
    document's size)."""

    entry: Int[Array, "n k"]
    row_start: Int[Array, "n k"]
    slot_start: Int[Array, "n k"]
    slots: Int[Array, "n k"]
    size: Int[Array, "n k"]


class BlockDevice(DeviceDataset):
    """The device half of a ``BlockDataset`` (legacy-only tables are ``None`` for preblocked data).

    Attributes:
        shuffle: the block order for the key (``None`` for source order).
        source_start: first global example of each source; ``real``: non-pad tokens per example.
        packed, first, count: legacy: per example, its packed block, first piece entry, pieces.
        start_block, start_offset, size: legacy: per entry (document, by position).
        shuffle_spec, seq_len, spans_per_row, doc_id, eod_id, pad_id: configuration (static).
    """

    shuffle: eqx.Module | None
    source_start: Int[Array, " sources_plus_1"]
    real: Int[Array, " blocks"]
    packed: Int[Array, " blocks"] | None
    first: Int[Array, " blocks"] | None
    count: Int[Array, " blocks"] | None
    start_block: Int[Array, " entries"] | None
    start_offset: Int[Array, " entries"] | None
    size: Int[Array, " entries"] | None
    shuffle_spec: ShuffleSpec = eqx.field(static=True)
    seq_len: int = eqx.field(static=True)
    spans_per_row: int = eqx.field(static=True)
    doc_id: int = eqx.field(static=True)
    eod_id: int = eqx.field(static=True)
    pad_id: int = eqx.field(static=True)

    @property
    def legacy(self) -> bool:
        return self.packed is not None

    def plan(self, rows: Rows, state=None) -> tuple[Plan, None]:
        example = self.shuffle_spec.apply(self.shuffle, rows.position, rows.epoch)
        source = jnp.searchsorted(self.source_start, example, side="right").astype(jnp.int32) - 1
        local = (example - self.source_start[source]).astype(jnp.int32)
        detail = self._pieces(self.packed[example]) if self.legacy else BlockPlan(local)
        return Plan(rows=rows, source=source, example=example, detail=detail), None

    def _pieces(self, packed: Int[Array, " n"]) -> PiecesPlan:
        S, k = self.seq_len, self.spans_per_row
        slot = jnp.arange(k, dtype=jnp.int32)[None, :]
        used = slot < self.count[packed][:, None]
        entry = jnp.where(used, self.first[packed][:, None] + slot, 0)
        start_block, start_offset, size = (t[entry] for t in (self.start_block, self.start_offset, self.size))
        here = start_block == packed[:, None]
        row_start = jnp.where(here, start_offset, 0)
        slot_start = jnp.where(here, 0, (packed[:, None] - start_block) * S - start_offset)
        slots = jnp.where(used, jnp.minimum(size - slot_start, S - row_start), 0)
        return PiecesPlan(entry, row_start, slot_start, slots, size)

    def build(self, plan: Plan, content: Content | None) -> Batch:
        ids = dict(doc_id=self.doc_id, eod_id=self.eod_id, pad_id=self.pad_id)
        if self.legacy:
            d = plan.detail
            tokens = assemble_rows(
                content.tokens,
                content.offsets,
                d.row_start,
                d.slot_start,
                d.slots,
                d.size,
                block_size=self.seq_len,
                **ids,
            )
        else:
            tokens = gather_windows(content.tokens, content.offsets[:, 0], width=self.seq_len)
        return block_batch(tokens, **ids)

    def real_tokens(self, plan: Plan) -> Int[Array, " n"]:
        return self.real[plan.example]
