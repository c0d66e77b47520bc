"""Least-consumed interleave: each row goes to the source that has consumed the fewest tokens.

The rule, row after row: take the source with the smallest consumed-token count; among sources
tied at that count, the one whose keyed hash ``tie_hash(salt[source], count)`` is smallest (so
ties are broken by a fixed seed, differently at every count, never "first wins"); add the row's
real tokens to that source's count. Three sources whose next rows hold ``a: 3, 3, ...``,
``b: 5, 5, ...``, ``c: 2, 4, ...`` tokens, all starting at 0, with ``hash(b) < hash(a) <
hash(c)`` at count 0 and ``hash(a) < hash(c)`` at count 6:

    row  counts (a, b, c)   least          takes
    0    (0, 0, 0)          a, b, c tied   b (hash)  +5
    1    (0, 5, 0)          a, c tied      a (hash)  +3
    2    (3, 5, 0)          c              c         +2
    3    (3, 5, 2)          c              c         +4
    4    (3, 5, 6)          a              a         +3
    5    (6, 5, 6)          b              b         +5
    6    (6, 10, 6)         a, c tied      a (hash)  +3

The row's tokens depend only on the source's next row, so the inputs are, per source, the token
counts of its next ``n`` rows (``row_tokens[j, s]``: row ``j`` of the table holds every source's
``j``-th next row; no source takes more than ``n`` of ``n`` rows). Counts are exact 64-bit numbers
held as two uint32 words (``hi``, ``lo``): no x64.

One ``lax.scan`` over the rows applies the rule literally. Inside a batch it carries 32-bit
counts relative to the least count at the batch's start: a row adds at most ``max_row_tokens``,
so while ``n * max_row_tokens < 2^32 - 1`` (the caller checks) every count that can still be the
least fits a word; a count 2^32 or more above the least is parked at ``2^32 - 1`` and cannot be
picked. A step is one min, one hash and two scatters over the sources: the reference form of the
rule. (XLA:CPU runs a loop whose step touches under 1 KiB as one compiled function: here up to
about 16 sources; beyond, each step dispatches its operations one by one. The pipeline's kernel
is ``interleave_tree.select_tournament``, the same picks in O(log sources) a row: see
``benchmarks/RESULTS.md``.)
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, UInt32

from ..uint32 import fmix32

U32 = jnp.uint32


class Counts(eqx.Module):
    """Consumed tokens per source (or one count: the least), exact: ``hi * 2^32 + lo``."""

    hi: UInt32[Array, "*sources"]
    lo: UInt32[Array, "*sources"]


class Selection(eqx.Module):
    """What a batch's selection decided.

    Attributes:
        source: ``int32[n]`` the source of each row.
        nth: ``uint32[n]`` which of the source's next rows it is (0 = its next row).
        taken: ``uint32[sources]`` rows each source gave.
        counts: the counts after the batch.
        tokens: ``int32[n]`` the real tokens of each row.
    """

    source: Int[Array, " n"]
    nth: UInt32[Array, " n"]
    taken: UInt32[Array, " sources"]
    counts: Counts
    tokens: Int[Array, " n"]


def source_salts(seed: UInt32[Array, ""], sources: int) -> UInt32[Array, " sources"]:
    """Distinct per-source salts from one seed word (``fmix32`` is a bijection)."""
    return fmix32(seed + jnp.arange(sources, dtype=U32) * U32(0x9E3779B9))


def named_salts(seed: UInt32[Array, ""], ids: UInt32[Array, " sources"]) -> UInt32[Array, " sources"]:
    """Per-source salts from one seed word and a distinct id per source (e.g. a name's crc32):
    distinct ids give distinct salts, and a source keeps its salt when others come or go."""
    return fmix32(seed ^ fmix32(ids))


def tie_hash(salt: UInt32[Array, "..."], count_lo: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
    """Keyed tie-break of a source at a count: ``fmix32(count_lo ^ salt)``.

    Only equal counts are ever compared by hash, so their low word suffices, and distinct salts
    give distinct hashes (``fmix32`` is a bijection): no two tied sources hash alike.
    """
    return fmix32(count_lo ^ salt)


def add64(counts: Counts, tokens: UInt32[Array, "..."]) -> Counts:
    """``counts + tokens`` with the carry into ``hi``."""
    lo = counts.lo + tokens
    return Counts(counts.hi + (lo < counts.lo).astype(U32), lo)


PARKED = 0xFFFFFFFF  # a relative count that can never be the least within a batch


def _relative(counts: Counts) -> tuple[Counts, UInt32[Array, " sources"]]:
    """The least count (``base``) and every count relative to it (``PARKED`` from 2^32 above)."""
    low_hi = counts.hi == jnp.min(counts.hi)
    lo_min = jnp.min(jnp.where(low_hi, counts.lo, U32(PARKED)))
    least = jnp.argmax(low_hi & (counts.lo == lo_min))  # the first source at the least count
    base = Counts(counts.hi[least], counts.lo[least])
    above = counts.hi - base.hi - (counts.lo < base.lo).astype(U32)  # exact: counts >= base
    return base, jnp.where(above > 0, U32(PARKED), counts.lo - base.lo)


def _absolute(base: Counts, relative: UInt32[Array, " sources"], counts: Counts) -> Counts:
    """``base + relative`` where not parked; parked sources keep ``counts``."""
    lo = base.lo + relative
    hi = base.hi + (lo < base.lo).astype(U32)
    parked = relative == U32(PARKED)
    return Counts(jnp.where(parked, counts.hi, hi), jnp.where(parked, counts.lo, lo))


@jax.jit
def select_scan(
    counts: Counts, row_tokens: Int[Array, "n sources"], salts: UInt32[Array, " sources"]
) -> Selection:
    """The least-consumed selection of ``n`` rows, one scan step per row.

    Args:
        counts: consumed tokens per source at the start of the batch.
        row_tokens: ``int32[n, sources]`` real tokens of each source's next ``n`` rows (column
            ``s`` is source ``s``'s), each in
            ``[0, max_row_tokens]`` with ``n * max_row_tokens < 2^32 - 1`` (and, int32,
            ``max_row_tokens < 2^31``).
        salts: ``uint32[sources]`` distinct tie-break salts (``source_salts``, ``named_salts``).

    Returns:
        The ``Selection``: each row's source and which of its next rows, and the new counts.
    """
    n, sources = row_tokens.shape
    table = row_tokens.astype(U32)
    base, relative = _relative(counts)

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
    return Selection(source, nth, taken, _absolute(base, relative, counts), tokens.astype(jnp.int32))
