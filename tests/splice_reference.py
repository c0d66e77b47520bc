"""An independent, deliberately naive numpy reference for splice datasets (its own checks are
``test_splice_reference.py``).

Everything here is written from the seed's text with plain Python loops: enumerate every ``(t, s)``
and prune, construct each frame as the seed's "Example Construction" does, compute coverage-
balanced weights start by start. The kernels must equal it; it shares no code with them.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

P = -1  # filler token in the seed's examples ("Null")


def ref_pairs(L, *, S, K=None, kt=1, ks=1, kw=1, m=2, start_mode="anchor_start"):
    """Every valid ``(t, s, copy_len)`` of one document in the seed's default order."""
    out = []
    if start_mode == "slide":
        return [(w, 0, S) for w in range(0, L - S + 1, kw)] if S >= m else []
    starts = [0] if start_mode == "anchor_start" else range(0, L, kt)
    for t in starts:
        suffix = L if start_mode == "cyclic_roll" else L - t
        fit = suffix if K is None else min(K, suffix)
        for s in range(0, max(0, S - fit) + 1, ks):  # the seed's tight bound s <= S - min(K, L - t)
            copy_len = min(fit, S - s)
            if copy_len >= m:
                out.append((t, s, copy_len))
    return out


def ref_frame(doc, t, s, copy_len, *, S, pad=P, eos=None, cyclic=False, isolate=False):
    """The seed's Example Construction for one row."""
    doc = np.asarray(doc)
    tokens = np.full(S, pad, dtype=np.int32)
    idx = (t + np.arange(copy_len)) % len(doc) if cyclic else t + np.arange(copy_len)
    tokens[s : s + copy_len] = doc[idx]
    if eos is not None and s > 0:
        tokens[s - 1] = eos
    loss_mask = np.zeros(S, dtype=np.int32)
    if copy_len >= 2:
        loss_mask[s : s + copy_len - 1] = 1
    segment_ids = np.zeros(S, dtype=np.int32)
    if isolate:
        segment_ids[s : s + copy_len] = 1
    else:
        segment_ids[s:] = 1
    return tokens, loss_mask, segment_ids


def ref_quotas(weights, total):
    """Largest-remainder quotas with exact fractions (ties to the lower index)."""
    weights = [Fraction(w) for w in weights]
    shares = [total * w / sum(weights) for w in weights]
    quotas = [math.floor(x) for x in shares]
    order = sorted(range(len(weights)), key=lambda i: (-(shares[i] - quotas[i]), i))
    for i in order[: total - sum(quotas)]:
        quotas[i] += 1
    return quotas


def ref_pass_order(quota, items):
    """Quantile indices in row order: pass ``c`` holds ``j = c, c + C, ...`` (``C`` passes)."""
    passes = max(-(-quota // max(items, 1)), 1)
    return [j for c in range(passes) for j in range(c, quota, passes)]


def ref_balanced_weights(L, K_i, *, kt=1, alpha=0.0):
    """``w(t) = (K_i / min(d(t), K_i))^alpha``, ``d(t) = 1 + min(t, L - K_i - t)``, per start."""
    starts = list(range(0, L - K_i + 1, kt))
    return starts, [(K_i / min(1 + min(t, L - K_i - t), K_i)) ** alpha for t in starts]


def ref_balanced_rows(lengths, *, S, K=None, kt=1, m=2, alpha=0.0, adaptive_k=True, quotas=None):
    """Coverage-balanced ``(doc, t, s, copy_len)`` rows without jitter, in row order (float64 CDF)."""
    rows = []
    Kc = S if K is None else min(K, S)
    for doc, L in enumerate(lengths):
        K_i = min(Kc, L) if adaptive_k else Kc
        if L < K_i or K_i < m:
            continue
        starts, weights = ref_balanced_weights(L, K_i, kt=kt, alpha=alpha)
        q = len(starts) if quotas is None else quotas[doc]
        cdf = np.concatenate([[0.0], np.cumsum(weights)])
        for j in ref_pass_order(q, len(starts)):
            if alpha == 0:
                k = ((2 * j + 1) * len(starts)) // (2 * q)
            else:
                k = int(np.searchsorted(cdf, (j + 0.5) / q * cdf[-1], side="right")) - 1
            rows.append((doc, starts[min(k, len(starts) - 1)], S - K_i, K_i))
    return rows
