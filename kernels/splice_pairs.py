"""Enumerated splice pairs: a document's ``(t, s)`` placements in closed form, never listed.

For suffix length ``v = L - t`` a start ``t`` fits ``count(v) = floor(max(0, S - min(K, v)) / k_s) + 1``
placements ``s = 0, k_s, ...`` (the seed's tight bound ``s <= S - min(K, L - t)``) and copies
``min(K, v, S)`` tokens; starts whose copy is shorter than ``min_copy_len`` are pruned. Item ``p``
of a document is its ``p``-th pair, ``t`` ascending then ``s`` ascending (the seed's default order):

    S = 5, L = 5, K = 3 (slide_within):  v = 5 4 3 2 (1 pruned) -> counts 3 3 3 4 -> 13 pairs
    item 9 -> past t = 0, 1, 2 (9 pairs) -> t = 3, s = 0, copy_len = 2 -> [3, 4, P, P, P]

``uniform`` layouts have one count per document (anchor_start: the single start ``t = 0``;
cyclic_roll: every start reads a full cyclic ``min(K, L)``; slide: windows of ``S`` at ``s = 0``),
so ``p -> (p // count, p % count)``. ``ragged`` (slide_within) counts grow once the suffix is
shorter than ``min(K, S)``; there ``p`` is found by binary search over the cumulative count

    C(k) = D(L) - D(L - k * k_t),    D(v) = sum of count(u) for u = v, v - k_t, ... >= 0,

where ``D`` is one table of ``min(K, S)`` entries shared by all documents (``count`` is constant
above it, so ``D`` extends linearly). Sums wrap modulo 2^32, which keeps differences exact.

``shuffle_content`` lays the epoch out in rounds: round ``i`` visits, in a permuted order, every
start that has an ``i``-th placement; ``shuffle_offsets`` permutes the placements of each start.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, UInt32

from .splice_schedule import U32, bit_length, midpoint_item, search_last, spread

PairLayout = Literal["uniform", "ragged"]
StartMode = Literal["anchor_start", "slide_within", "cyclic_roll", "slide"]
UNBOUNDED = 2**31 - 1  # content_length=None: as many tokens as fit


def pair_count(v, *, seq_len: int, content_length: int, offset_stride: int):
    """Placements of a start with suffix length ``v`` (numpy or jax, elementwise)."""
    room = np.maximum(seq_len - np.minimum(v, content_length), 0)
    return room // offset_stride + 1


def _host_table(v: np.ndarray, table: np.ndarray, cap: int, kt: int) -> np.ndarray:
    """Exact int64 ``D(v)`` (the kernel's ``_table`` without wrapping)."""
    top = table.shape[0]
    steps = np.maximum(v - top + kt, 0) // kt
    base = v - steps * kt
    return np.where(base >= 0, table[np.clip(base, 0, top - 1)], 0) + steps * cap


class PairPlacement(eqx.Module):
    """Per-document tables of an enumerated pair schedule.

    Attributes:
        doc_len: ``int32[docs]`` document lengths ``L``.
        slots: ``uint32[docs]`` valid starts ``t = 0, t_stride, ...`` per document.
        per_slot: ``uint32[docs]`` placements per start (uniform layout).
        copy: ``int32[docs]`` tokens copied per row (uniform layout).
        prefix: ``uint32[min(K, S)]`` the shared table ``D`` (ragged layout; empty otherwise).
        content_perm: optional lane permutation ``perm(x, length, epoch, doc, salt)`` of starts.
        offset_perm: optional lane permutation of placements within a start.
    """

    doc_len: Int[Array, " docs"]
    slots: UInt32[Array, " docs"]
    per_slot: UInt32[Array, " docs"]
    copy: Int[Array, " docs"]
    prefix: UInt32[Array, " table"]
    content_perm: eqx.Module | None
    offset_perm: eqx.Module | None
    layout: PairLayout = eqx.field(static=True)
    cyclic: bool = eqx.field(static=True)
    seq_len: int = eqx.field(static=True)
    content_length: int = eqx.field(static=True)  # 2^31 - 1 for "as many as fit"
    t_stride: int = eqx.field(static=True)
    s_stride: int = eqx.field(static=True)
    search_steps: int = eqx.field(static=True)

    @classmethod
    def build(
        cls,
        doc_lengths: np.ndarray,
        *,
        start_mode: StartMode,
        seq_len: int,
        content_length: int | None,
        content_stride: int,
        offset_stride: int,
        min_copy_len: int,
        content_perm: eqx.Module | None = None,
        offset_perm: eqx.Module | None = None,
    ) -> tuple[PairPlacement, np.ndarray]:
        """Tables for ``doc_lengths`` (host, O(num_docs + seq_len)); returns ``(placement, items)``.

        ``items`` (int64) counts each document's pairs; documents whose copies would all be shorter
        than ``min_copy_len`` get 0. For ``start_mode="slide"`` ``content_stride`` is the window
        stride and each window copies ``seq_len`` tokens at ``s = 0``.
        """
        lengths = np.asarray(doc_lengths, dtype=np.int64)
        big = UNBOUNDED if content_length is None else min(int(content_length), UNBOUNDED)
        ks, kt, S = int(offset_stride), int(content_stride), int(seq_len)
        copy = np.minimum(np.minimum(lengths, big), S)
        per_slot = pair_count(lengths, seq_len=S, content_length=big, offset_stride=ks)
        valid = copy >= min_copy_len
        layout: PairLayout = "uniform"
        table = np.zeros(0, dtype=np.int64)
        if start_mode == "anchor_start":
            slots = valid.astype(np.int64)
        elif start_mode == "cyclic_roll":
            slots = np.where(valid, -(-lengths // kt), 0)
        elif start_mode == "slide":
            valid = (lengths >= S) & (S >= min_copy_len)
            slots = np.where(valid, (lengths - S) // kt + 1, 0)
            per_slot, copy = np.ones_like(lengths), np.full_like(lengths, S)
        else:
            layout = "ragged"
            valid = (lengths >= min_copy_len) & (min(big, S) >= min_copy_len)
            slots = np.where(valid, (lengths - min_copy_len) // kt + 1, 0)
            top = min(big, S)
            counts = pair_count(np.arange(top), seq_len=S, content_length=big, offset_stride=ks)
            table = counts.copy()
            for r in range(kt):  # running sums along each residue class mod k_t
                table[r::kt] = np.cumsum(counts[r::kt])
        per_slot = np.where(valid, per_slot, 0)
        if layout == "uniform":
            items = slots * per_slot
        else:
            cap = pair_count(top, seq_len=S, content_length=big, offset_stride=ks)
            items = _host_table(lengths, table, cap, kt) - _host_table(lengths - slots * kt, table, cap, kt)
        last = lengths - np.maximum(slots - 1, 0) * kt
        rounds = np.where(slots > 0, pair_count(last, seq_len=S, content_length=big, offset_stride=ks), 0)
        placement = cls(
            doc_len=jnp.asarray(lengths, dtype=jnp.int32),
            slots=jnp.asarray(slots, dtype=U32),
            per_slot=jnp.asarray(per_slot, dtype=U32),
            copy=jnp.asarray(copy, dtype=jnp.int32),
            prefix=jnp.asarray(table % 2**32, dtype=U32),
            content_perm=content_perm,
            offset_perm=offset_perm,
            layout=layout,
            cyclic=start_mode == "cyclic_roll",
            seq_len=S,
            content_length=big,
            t_stride=kt,
            s_stride=ks,
            search_steps=bit_length(max(int(slots.max(initial=1)), int(rounds.max(initial=1)))),
        )
        return placement, items.astype(np.int64)

    def grid(self, doc: int, *, starts: int, offsets: int) -> list[tuple[int, int, int]]:
        """Host: ``(t, s, copy_len)`` at ``starts`` spread starts x ``offsets`` spread placements."""
        length, slots = int(np.asarray(self.doc_len)[doc]), int(np.asarray(self.slots)[doc])
        rows = []
        for k in spread(slots, starts):
            v = length - k * self.t_stride
            if self.layout == "uniform":
                count, copy = int(np.asarray(self.per_slot)[doc]), int(np.asarray(self.copy)[doc])
            else:
                count = int(
                    pair_count(
                        v,
                        seq_len=self.seq_len,
                        content_length=self.content_length,
                        offset_stride=self.s_stride,
                    )
                )
                copy = min(v, self.content_length, self.seq_len)
            rows += [(k * self.t_stride, i * self.s_stride, copy) for i in spread(count, offsets)]
        return rows

    # count(v) and the table D, for the ragged layout --------------------------------------------
    def count(self, v: Int[Array, "..."]) -> UInt32[Array, "..."]:
        room = jnp.maximum(self.seq_len - jnp.minimum(v, self.content_length), 0)
        return (room // self.s_stride + 1).astype(U32)

    def _table(self, v: Int[Array, "..."]) -> UInt32[Array, "..."]:
        """``D(v)``: the table below ``min(K, S)``, extended by the constant count above it."""
        top = self.prefix.shape[0]  # min(K, S); count(u) is constant for u >= top
        steps = jnp.maximum(v - (top - 1) + self.t_stride - 1, 0) // self.t_stride
        base = v - steps * self.t_stride
        below = jnp.where(base >= 0, self.prefix[jnp.clip(base, 0, top - 1)], U32(0))
        return below + steps.astype(U32) * self.count(jnp.int32(top))

    def cumulative(self, doc_len: Int[Array, "..."], k: Int[Array, "..."]) -> UInt32[Array, "..."]:
        """``C(k)``: pairs of the first ``k`` starts."""
        return self._table(doc_len) - self._table(doc_len - k * self.t_stride)

    def _first_with_more(self, doc_len, slots, i):
        """Index of the first start with more than ``i`` placements (counts grow with ``t``)."""
        i = i.astype(jnp.int32)
        cap = self.count(jnp.int32(self.prefix.shape[0])).astype(jnp.int32)
        threshold = self.seq_len - i * self.s_stride  # count(v) <= i  <=>  v > threshold
        above = jnp.maximum(doc_len - threshold + self.t_stride - 1, 0) // self.t_stride
        return jnp.where(i < cap, 0, jnp.minimum(above, slots.astype(jnp.int32)))

    # the map -------------------------------------------------------------------------------------
    def place(
        self,
        doc: Int[Array, " n"],
        j: UInt32[Array, " n"],
        quota: UInt32[Array, " n"],
        items: UInt32[Array, " n"],
        *,
        rows: UInt32[Array, " n"],
        epoch: UInt32[Array, "*n"],
    ) -> tuple[Int[Array, " n"], Int[Array, " n"], Int[Array, " n"]]:
        """Quantile ``j`` of document ``doc``'s ``quota`` rows → ``(t, s, copy_len)``, int32."""
        del rows
        item = midpoint_item(j, quota, items)
        slots = self.slots[doc]
        doc_len = self.doc_len[doc]
        if self.layout == "uniform":
            per_slot = self.per_slot[doc]
            if self.content_perm is None:
                k, i = item // per_slot, item % per_slot
            else:
                i, rank = item // slots, item % slots
                k = self.content_perm(rank, slots, epoch, doc, i)
            copy_len = self.copy[doc]
        else:
            if self.content_perm is None:
                k = search_last(lambda k: self.cumulative(doc_len, k), item, slots, steps=self.search_steps)
                i = item - self.cumulative(doc_len, k)
            else:
                last = doc_len - (slots.astype(jnp.int32) - 1) * self.t_stride
                rounds = self.count(last)

                def before(i):  # rows of rounds < i: sum over starts of min(count, i)
                    first = self._first_with_more(doc_len, slots, i)
                    return self.cumulative(doc_len, first) + i.astype(U32) * (slots - first.astype(U32))

                i = search_last(before, item, rounds, steps=self.search_steps).astype(U32)
                first = self._first_with_more(doc_len, slots, i)
                rank = item - before(i)
                k = first.astype(U32) + self.content_perm(rank, slots - first.astype(U32), epoch, doc, i)
            k = k.astype(jnp.int32)
            v = doc_len - k * self.t_stride
            copy_len = jnp.minimum(jnp.minimum(v, self.content_length), self.seq_len)
            per_slot = self.count(v)
        k = k.astype(jnp.int32)
        if self.offset_perm is not None:
            i = self.offset_perm(i, per_slot, epoch, doc, k)
        t = k * self.t_stride
        s = i.astype(jnp.int32) * self.s_stride
        return t, s, copy_len.astype(jnp.int32)
