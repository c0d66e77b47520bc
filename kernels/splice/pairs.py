"""Splice placements: quantile ``j`` of a document's rows -> ``(t, s, copy_len)``, in closed form.

Enumerated pairs (``PairPlacement``), never listed: for suffix length ``v = L - t`` a start ``t``
fits ``count(v) = floor(max(0, S - min(K, v)) / k_s) + 1`` placements ``s = 0, k_s, ...`` (the
seed's tight bound ``s <= S - min(K, L - t)``) and copies ``min(K, v, S)`` tokens; starts whose copy
is shorter than ``min_copy_len`` are pruned. Item ``p`` of a document is its ``p``-th pair, ``t``
ascending then ``s`` ascending (the seed's default order):

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

Coverage-balanced starts (``BalancedPlacement``): every row copies a full ``K_i`` tokens,
right-aligned in the frame. Document ``i`` with length ``L`` and content length ``K_i``
(``min(K, S, L)`` with ``adaptive_k``, else ``min(K, S)``) has starts ``t = 0, k_t, ...  <= L - K_i``;
every row copies ``[t, t + K_i)`` to ``s = S - K_i - jitter``. A document's quota rows pick starts
by quantile mapping over its start CDF. With ``alpha = 0`` the CDF is uniform and the mapping is
exact integer arithmetic; with ``alpha > 0`` start ``t`` weighs

    w(t) = (K_i / min(d(t), K_i)) ** alpha,    d(t) = 1 + min(t, L - K_i - t),

so windows within ``K_i`` of either document edge (whose tokens fewer windows cover) are drawn
more often. The CDF is closed form from one shared float32 table ``U[d] = d**-alpha + U[d - k_t]``:
the left edge sums ``U`` from ``d = 1``, the right edge from ``d = 1 + r`` with ``r`` the gap the
stride leaves at the end, and the middle has weight 1 per start.

    L = 8, K_i = 4, alpha = 1:  t = 0 1 2 3 4,  d = 1 2 3 2 1,  w = 4 2 4/3 2 4

Jitter ``j in [0, J_i)``, ``J_i = min(offset_jitter, S - K_i) + 1``: ``low_discrepancy`` takes
``(quantile + epoch) mod J_i`` (every placement equally often per epoch, passes and epochs
rotate); ``uniform`` hashes ``(key, epoch, row)``.
"""

from __future__ import annotations

import abc
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float32, Int, PRNGKeyArray, UInt32

from .splice_rows import U32, midpoint_item, search_last

JitterMode = Literal["uniform", "low_discrepancy"]
PairLayout = Literal["uniform", "ragged"]
UNBOUNDED = 2**31 - 1  # content_length=None: as many tokens as fit


def pair_count(v, *, seq_len: int, content_length: int, offset_stride: int):
    """Placements of a start with suffix length ``v`` (numpy or jax, elementwise)."""
    room = np.maximum(seq_len - np.minimum(v, content_length), 0)
    return room // offset_stride + 1


class Placement(eqx.Module):
    """A splice schedule's per-document placement: what ``SpliceSchedule`` calls for each row."""

    @abc.abstractmethod
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


class PairPlacement(Placement):
    """Per-document tables of an enumerated pair schedule (built by ``meshbatch.datasets.splice.tables``).

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

    # count(v) and the table D, for the ragged layout --------------------------------------------
    def count(self, v: Int[Array, "..."]) -> UInt32[Array, "..."]:
        room = jnp.maximum(self.seq_len - jnp.minimum(v, self.content_length), 0)
        return (room // self.s_stride + 1).astype(U32)

    def _table(self, v: Int[Array, "..."]) -> UInt32[Array, "..."]:
        """``D(v)``: the table below ``min(K, S)``, extended by the constant count above it."""
        top = self.prefix.shape[0]  # min(K, S); count(u) is constant for u >= top
        # ``steps`` terms u = v, v - k_t, ... are >= top, and ``base`` is the first below it. Written
        # so that no int32 intermediate passes 2^31 (v near 2^31 with k_t near 2^30 would wrap).
        above = v >= top
        over = jnp.where(above, v - top, 0)
        steps = jnp.where(above, over // self.t_stride + 1, 0)
        base = jnp.where(above, (top - self.t_stride) + over % self.t_stride, v)
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
        # starts t = k * k_t with L - t > threshold: ceil((L - threshold) / k_t) of them; the
        # difference is in (0, 2^32) where it counts, so it is taken in uint32 (int32 could wrap)
        gap = doc_len.astype(U32) - threshold.astype(U32)
        above = jnp.where(doc_len > threshold, (gap - U32(1)) // U32(self.t_stride) + U32(1), U32(0))
        return jnp.where(i < cap, 0, jnp.minimum(above, slots).astype(jnp.int32))

    # the map -------------------------------------------------------------------------------------
    def place(self, doc, j, quota, items, *, rows, epoch):
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


class BalancedPlacement(Placement):
    """Per-document tables of a coverage-balanced schedule (built by ``meshbatch.datasets.splice.tables``).

    Attributes:
        doc_len: ``int32[docs]`` document lengths.
        content: ``int32[docs]`` content length ``K_i``.
        jitter: ``uint32[docs]`` jitter placements ``J_i``.
        edge_scale: ``float32[docs]`` ``K_i ** alpha`` (alpha > 0 only).
        edge_table: ``float32[table]`` the shared table ``U`` (alpha > 0 only; else empty).
        jitter_key: key for ``uniform`` jitter, or ``None``.
    """

    doc_len: Int[Array, " docs"]
    content: Int[Array, " docs"]
    jitter: UInt32[Array, " docs"]
    edge_scale: Float32[Array, " docs"]
    edge_table: Float32[Array, " table"]
    jitter_key: PRNGKeyArray | None
    seq_len: int = eqx.field(static=True)
    t_stride: int = eqx.field(static=True)
    weighted: bool = eqx.field(static=True)
    jitter_mode: JitterMode = eqx.field(static=True)
    search_steps: int = eqx.field(static=True)
    cyclic = False  # coverage-balanced copies never wrap

    def _edge_mass(self, scale, content, gap, n):
        """Weight of the ``n`` starts nearest one edge, whose distances are ``1 + gap + m * k_t``."""
        reach = content - 1 - gap  # distances 1 + gap + m * k_t below K_i: ceil(reach / k_t)
        edge = jnp.where(reach > 0, (reach - 1) // self.t_stride + 1, 0)  # (never past 2^31)
        m = jnp.minimum(n, edge)
        idx = jnp.clip(1 + gap + (m - 1) * self.t_stride, 0, self.edge_table.shape[0] - 1)
        weighted = jnp.where(m > 0, scale * self.edge_table[idx], jnp.float32(0))
        return weighted + (n - m).astype(jnp.float32)

    def cumulative(self, doc, k):
        """Weight of starts ``[0, k)`` of document ``doc`` (float32)."""
        doc_len, content, scale = self.doc_len[doc], self.content[doc], self.edge_scale[doc]
        span = doc_len - content  # L - K_i >= 0
        starts = span // self.t_stride + 1
        left = (span // self.t_stride) // 2 + 1  # starts nearer the left edge (ties go left)
        gap = span - (starts - 1) * self.t_stride
        right_total = self._edge_mass(scale, content, gap, starts - left)
        in_left = self._edge_mass(scale, content, jnp.zeros_like(gap), jnp.minimum(k, left))
        in_right = right_total - self._edge_mass(scale, content, gap, starts - jnp.maximum(k, left))
        return in_left + in_right

    def place(self, doc, j, quota, items, *, rows, epoch):
        if self.weighted:
            total = self.cumulative(doc, items.astype(jnp.int32))
            target = (j.astype(jnp.float32) + 0.5) / quota.astype(jnp.float32) * total
            k = search_last(lambda k: self.cumulative(doc, k), target, items, steps=self.search_steps)
        else:
            k = midpoint_item(j, quota, items).astype(jnp.int32)
        jitter = self.jitter[doc]
        if self.jitter_mode == "low_discrepancy" or self.jitter_key is None:
            offset = (j % jitter + epoch % jitter) % jitter
        else:
            epochs = jnp.broadcast_to(epoch, rows.shape)  # one epoch, or one per row

            def row_bits(e, r):
                row_key = jax.random.fold_in(jax.random.fold_in(self.jitter_key, e), r)
                return jax.random.bits(row_key, dtype=U32)

            bits = jax.vmap(row_bits)(epochs, rows)
            offset = bits % jitter
        content = self.content[doc]
        s = self.seq_len - content - offset.astype(jnp.int32)
        return k * self.t_stride, s, content
