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

Within a batch, counts are held as 32-bit words relative to the least count at the batch's
start: a row adds at most ``max_row_tokens``, so while ``n * max_row_tokens < 2^32 - 1`` (the
caller checks) every count that can still be the least fits a word; a count 2^32 or more above
the least is parked at ``PARKED`` (``2^32 - 1``) and cannot be picked.

The pipeline's kernel is ``interleave_tree.select_tournament`` (O(log sources) a row); this module
holds what it shares with the rule's other forms: the counts, the selection, the salts and the
tie hash. The rule row by row (one ``lax.scan`` step, an argmin over every source), the tests'
reference, is ``tests/interleave_reference.py``.
"""

from __future__ import annotations

import equinox as eqx
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
