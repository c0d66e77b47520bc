"""Host side of a splice schedule: the per-document tables its kernels read, built once.

Each builder is O(num_docs + seq_len) numpy work; nothing here loops over strides, pairs or rows.

    lengths = [5], seq_len = 5, content_length = 3, slide_within:
    pair_placement(...) -> items = [13]  (the seed's example A: counts 3 3 3 4 over t = 0..3)
    largest_remainder([2, 1, 1], 7) -> [4, 2, 1]   (shares 3.5 1.75 1.75: one extra to the larger remainder)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from meshbatch.kernels.internal import UNBOUNDED, BalancedPlacement, DocumentPool, PairPlacement, pair_count

from .splice_spec import SpliceSpec

U32 = jnp.uint32
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_STARTS = 2**24  # starts a float32 CDF tells apart (integers exact up to 2^24)
logger = logging.getLogger(__name__)


def bit_length(n: int) -> int:
    """Binary-search steps that cover ``[0, n)``."""
    return max(int(n), 1).bit_length()


def spread(n: int, k: int) -> list[int]:
    """``min(n, k)`` distinct evenly spaced integers of ``[0, n)``, both ends included."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer quotas proportional to ``weights``, summing to ``total``.

    Floors of the float64 shares, then one more for the largest remainders (ties: lower index).
    """
    weights = np.asarray(weights, dtype=np.float64)
    share = total * (weights / weights.sum())
    quota = np.floor(share).astype(np.int64)
    order = np.lexsort((np.arange(weights.shape[0]), -(share - quota)))
    short = total - int(quota.sum())
    if short >= 0:
        quota[order[:short]] += 1
    else:  # float rounding pushed the floors past total: take back from the smallest remainders
        quota[order[short:]] -= 1
    return quota


def residue_cumsum(values: np.ndarray, stride: int) -> np.ndarray:
    """Running sums along each residue class mod ``stride``: ``out[v] = values[v] + out[v - stride]``.

    O(len(values)) for any stride (a stride beyond the length leaves every class one long).
    """
    n = values.shape[0]
    if stride >= n:
        return values.copy()
    rows = -(-n // stride)
    padded = np.zeros(rows * stride, dtype=values.dtype)
    padded[:n] = values
    return np.cumsum(padded.reshape(rows, stride), axis=0).reshape(-1)[:n]


def host_table(v: np.ndarray, table: np.ndarray, cap: int, kt: int) -> np.ndarray:
    """Exact int64 ``D(v)`` of ``PairPlacement`` (the kernel's ``_table`` without wrapping)."""
    top = table.shape[0]
    steps = np.maximum(v - top + kt, 0) // kt
    base = v - steps * kt
    return np.where(base >= 0, table[np.clip(base, 0, top - 1)], 0) + steps * cap


def pair_placement(
    lengths: np.ndarray,
    spec: SpliceSpec,
    content_perm: eqx.Module | None = None,
    offset_perm: eqx.Module | None = None,
) -> tuple[PairPlacement, np.ndarray]:
    """Tables of an enumerated pair schedule; returns ``(placement, items)``.

    ``items`` (int64) counts each document's pairs; documents whose copies would all be shorter
    than ``min_copy_len`` get 0. With ``mode="slide"`` starts step by ``window_stride`` and each
    window copies ``seq_len`` tokens at ``s = 0``.
    """
    start_mode = "slide" if spec.mode == "slide" else spec.content_start_mode
    big = UNBOUNDED if spec.content_length is None else min(spec.content_length, UNBOUNDED)
    ks, S, min_copy_len = spec.offset_stride, spec.seq_len, spec.min_copy_len
    kt = spec.window_stride if start_mode == "slide" else spec.content_stride
    copy = np.minimum(np.minimum(lengths, big), S)
    per_slot = pair_count(lengths, seq_len=S, content_length=big, offset_stride=ks)
    valid = copy >= min_copy_len
    layout = "uniform"
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
        table = residue_cumsum(
            pair_count(np.arange(top), seq_len=S, content_length=big, offset_stride=ks), kt
        )
    per_slot = np.where(valid, per_slot, 0)
    if layout == "uniform":
        items = slots * per_slot
    else:
        cap = pair_count(top, seq_len=S, content_length=big, offset_stride=ks)
        items = host_table(lengths, table, cap, kt) - host_table(lengths - slots * kt, table, cap, kt)
    last = lengths - np.maximum(slots - 1, 0) * kt
    rounds = np.where(slots > 0, pair_count(last, seq_len=S, content_length=big, offset_stride=ks), 0)
    placement = PairPlacement(
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


def balanced_placement(
    lengths: np.ndarray, spec: SpliceSpec, jitter_key: PRNGKeyArray | None = None
) -> tuple[BalancedPlacement, np.ndarray]:
    """Tables of a coverage-balanced schedule; returns ``(placement, items)``.

    ``items`` (int64) counts each document's starts; documents with ``L < K_i`` or
    ``K_i < min_copy_len`` get 0.

    Raises:
        ValueError: an ``alpha`` so large that the edge weights (``K_i ** alpha`` times the
            table) overflow the float32 the kernel sums them in.
    """
    S, kt, alpha = spec.seq_len, spec.content_stride, float(spec.alpha)
    K = S if spec.content_length is None else min(spec.content_length, S)
    content = np.minimum(lengths, K) if spec.adaptive_k else np.full_like(lengths, K)
    valid = (lengths >= content) & (content >= spec.min_copy_len)
    items = np.where(valid, (lengths - content) // kt + 1, 0)
    jitter = np.minimum(spec.offset_jitter, S - content) + 1
    weighted = alpha > 0
    if weighted:
        table = np.zeros(S + 1, dtype=np.float64)
        table[1:] = np.arange(1, S + 1, dtype=np.float64) ** -alpha
        table = residue_cumsum(table, kt)  # U[d] = d^-alpha + U[d - k_t]
        with np.errstate(over="ignore"):
            scale = np.where(valid, np.maximum(content, 1).astype(np.float64) ** alpha, 0.0)
            heaviest = 2 * float(scale.max()) * float(table.max()) + float(items.max())
        if not heaviest < FLOAT32_MAX:
            raise ValueError(
                f"alpha={alpha} makes the edge weights of a {int(content.max())}-token copy overflow "
                f"float32 ({int(content.max())} ** {alpha}); use a smaller alpha"
            )
        if items.max(initial=0) > FLOAT32_STARTS:
            doc = int(np.argmax(items))
            logger.warning(
                "coverage_balanced with alpha=%s: document %d has %d starts, more than the float32 "
                "start CDF resolves (2^24): some of its middle starts are drawn twice and others never "
                "(use alpha=0 or a larger content_stride for it)",
                alpha,
                doc,
                int(items[doc]),
            )
    else:
        table, scale = np.zeros(0), np.zeros_like(lengths, dtype=np.float64)
    placement = BalancedPlacement(
        doc_len=jnp.asarray(lengths, dtype=jnp.int32),
        content=jnp.asarray(content, dtype=jnp.int32),
        jitter=jnp.asarray(jitter, dtype=U32),
        edge_scale=jnp.asarray(scale, dtype=jnp.float32),
        edge_table=jnp.asarray(table, dtype=jnp.float32),
        jitter_key=jitter_key,
        seq_len=S,
        t_stride=kt,
        weighted=weighted,
        jitter_mode=spec.jitter_mode,
        search_steps=bit_length(int(items.max(initial=1))),
    )
    return placement, items.astype(np.int64)


def document_pool(docs: Sequence[np.ndarray], *, margin: int = 0) -> DocumentPool:
    """Documents concatenated for the device, with ``margin`` zeros at each end (host, once).

    Raises:
        TypeError: a document is not an integer array.
        ValueError: a document is not 1-D, its tokens do not fit int32, or the pool holds 2^31
            tokens or more.
    """
    arrays = []
    for i, doc in enumerate(docs):
        if isinstance(doc, str | bytes):
            raise TypeError(f"docs[{i}] must be an array of token ids (got a {type(doc).__name__})")
        doc = np.asarray(doc)
        if doc.ndim != 1:
            raise ValueError(f"docs[{i}] must be a 1-D integer array (got shape={doc.shape}, {doc.dtype})")
        if doc.size and not np.issubdtype(doc.dtype, np.integer):
            raise TypeError(f"docs[{i}] must be a 1-D integer array (got shape={doc.shape}, {doc.dtype})")
        arrays.append(doc)
    lengths = np.array([doc.shape[0] for doc in arrays], dtype=np.int64)
    offsets = margin + np.concatenate([[0], np.cumsum(lengths)])
    if offsets[-1] + margin >= 2**31:
        raise ValueError(f"a device pool holds < 2^31 tokens (got {int(offsets[-1])}); fetch spans instead")
    flat = np.concatenate([doc.astype(np.int64) for doc in arrays]) if arrays else np.zeros(0, np.int64)
    if flat.size and (flat.min() < -(2**31) or flat.max() >= 2**31):
        bad = int(flat.min()) if flat.min() < -(2**31) else int(flat.max())
        raise ValueError(f"document tokens must fit int32 (got token id {bad})")
    flat = np.pad(flat, (margin, margin))
    return DocumentPool(jnp.asarray(flat, dtype=jnp.int32), jnp.asarray(offsets, dtype=jnp.int32), margin)
