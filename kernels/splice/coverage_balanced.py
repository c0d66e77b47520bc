"""Coverage-balanced starts: every row copies a full ``K_i`` tokens, right-aligned in the frame.

Document ``i`` with length ``L`` and content length ``K_i`` (``min(K, S, L)`` with ``adaptive_k``,
else ``min(K, S)``) has starts ``t = 0, k_t, ...  <= L - K_i``; every row copies ``[t, t + K_i)`` to
``s = S - K_i - jitter``. A document's quota rows pick starts by quantile mapping over its start
CDF. With ``alpha = 0`` the CDF is uniform and the mapping is exact integer arithmetic; with
``alpha > 0`` start ``t`` weighs

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

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float32, Int, PRNGKeyArray, UInt32

from .splice_rows import U32, midpoint_item, search_last

JitterMode = Literal["uniform", "low_discrepancy"]


class BalancedPlacement(eqx.Module):
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
