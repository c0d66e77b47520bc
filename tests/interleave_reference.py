"""The least-consumed rule row by row (``select_scan``), the reference the tests hold the
pipeline's kernel (``meshbatch.kernels.select_tournament``) to, and ``select_merge``, the same
picks as a parallel merge (``benchmarks/select_merge.py``), loaded from the benchmark.

``select_scan`` applies the rule of ``kernels/mixtures/interleave_tree.py`` literally: one
``lax.scan`` step per row, an argmin over every source (O(sources) a row). Inside a batch it carries 32-bit
counts relative to the least count at the batch's start: a row adds at most ``max_row_tokens``,
so while ``n * max_row_tokens < 2^32 - 1`` every count that can still be the least fits a word; a
count 2^32 or more above the least is parked at ``2^32 - 1`` and cannot be picked.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, UInt32

from meshbatch.kernels import Counts, Selection, tie_hash
from meshbatch.kernels.mixtures.interleave_tree import PARKED

U32 = jnp.uint32


def relative_counts(counts: Counts) -> tuple[Counts, UInt32[Array, " sources"]]:
    """The least count (``base``) and every count relative to it (``PARKED`` from 2^32 above)."""
    low_hi = counts.hi == jnp.min(counts.hi)
    lo_min = jnp.min(jnp.where(low_hi, counts.lo, U32(PARKED)))
    least = jnp.argmax(low_hi & (counts.lo == lo_min))  # the first source at the least count
    base = Counts(counts.hi[least], counts.lo[least])
    above = counts.hi - base.hi - (counts.lo < base.lo).astype(U32)  # exact: counts >= base
    return base, jnp.where(above > 0, U32(PARKED), counts.lo - base.lo)


def absolute_counts(base: Counts, relative: UInt32[Array, " sources"], counts: Counts) -> Counts:
    """``base + relative`` where not parked; parked sources keep ``counts``."""
    lo = base.lo + relative
    hi = base.hi + (lo < base.lo).astype(U32)
    parked = relative == U32(PARKED)
    return Counts(jnp.where(parked, counts.hi, hi), jnp.where(parked, counts.lo, lo))


@jax.jit
def select_scan(
    counts: Counts, row_tokens: Int[Array, "n sources"], salts: UInt32[Array, " sources"]
) -> Selection:
    """The least-consumed selection of ``n`` rows, one scan step per row: ``select_tournament``'s
    arguments (``row_tokens[j, s]``: source ``s``'s ``j``-th next row) and its ``Selection``."""
    n, sources = row_tokens.shape
    table = row_tokens.astype(U32)
    base, relative = relative_counts(counts)

    def step(carry, _):
        relative, taken = carry
        tied = relative == jnp.min(relative)
        h = jnp.where(tied, tie_hash(salts, base.lo + relative), U32(PARKED))
        # the tied source of least hash; ``argmin(h)`` alone would take a lower, untied source
        # when the winner's hash is 0xFFFFFFFF itself
        s = jnp.argmax(tied & (h == jnp.min(h))).astype(jnp.int32)
        nth = taken[s]
        tokens = table[nth.astype(jnp.int32), s]  # one index dtype (jax 0.7 promotes s with nth)
        return (relative.at[s].add(tokens), taken.at[s].add(U32(1))), (s, nth, tokens)

    (relative, taken), (source, nth, tokens) = jax.lax.scan(
        step, (relative, jnp.zeros(sources, U32)), None, length=n
    )
    return Selection(source, nth, taken, absolute_counts(base, relative, counts), tokens.astype(jnp.int32))


def _load_merge():
    """``benchmarks/select_merge.py`` as a module (the benchmarks are scripts, not a package)."""
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "select_merge.py")
    spec = importlib.util.spec_from_file_location("select_merge", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["select_merge"] = module
    spec.loader.exec_module(module)
    return module


merge = sys.modules.get("select_merge") or _load_merge()
select_merge = merge.select_merge
