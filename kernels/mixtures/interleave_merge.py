"""The least-consumed interleave as a parallel k-way merge: ``select_scan``'s picks, no scan.

Source ``s``'s ``j``-th next row is picked when ``s`` stands at count ``key[s, j] = c_s +
(real tokens of its first j next rows)``: nondecreasing in ``j``. The scan picks, row after row,
the least ``(count, tie_hash(salt[s], count), s)`` among the sources' next rows; ordering every
candidate by ``(key, tie_hash(salt[s], key), s, j)`` makes each source's sequence strictly
increasing (a zero-token row repeats ``key`` and its hash, and ``j`` grows: a source tied with
itself keeps winning, as in the scan), so the scan's picks are the merge of those sequences,
i.e. the ``n`` smallest candidates in that order. The hand-worked trace of ``interleave.py``
(a: 3 3 3, b: 5 5, c: 2 4 4, all at 0; hash b < a < c at 0 and a < c at 6):

    key    a: 0 3 6 9     b: 0 5 10     c: 0 2 6 10
    order  (0,b) (0,a) (0,c) (2,c) (3,a) (5,b) (6,a) (6,c) | (9,a) (10,..) ...
    n = 8  threshold T = 6: 6 keys below it, 2 of the tie at 6 taken (a before c by hash)

All parallel: prefix sums per source (an associative scan: XLA:CPU's ``cumsum`` is a reduce
window, twice as slow here), a bisection over the 32-bit threshold ``T`` (the least key with at
least ``n`` candidates at or below it, between the least and the largest key at column
``ceil(n / sources) - 1``; each probe one compare and sum), the tie at ``T`` taken by ``(hash,
source)``, then the picks' row order by ``(key, hash)`` (``merge_order.two_pass_order``: two
single-array sorts, or the exact radix sort when the keys span too much). Keys are 32-bit
relative to the least count (``interleave._relative``: a count 2^32 or more above it, or a key
that would pass 2^32 - 1, saturates and is never among the ``n`` least, since the least source
alone has ``n`` keys below ``n * max_row_tokens < 2^32 - 1``); the new counts are exact 64-bit
(two words).

Windows: a source takes about ``n / sources`` rows, so the merge first runs on each source's
next ``4n / sources`` rows, then ``32n / sources``, then all ``n``: a window's picks are final
when no source took all of its window (a source's later candidates follow its last one, which
``n`` smaller candidates already beat), else the next window decides (``lax.cond``: one runs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, UInt32

from .interleave import PARKED, Counts, Selection, _relative, add64, tie_hash
from .merge_order import two_pass_order

U32 = jnp.uint32


def _merge(
    base: Counts,
    relative: UInt32[Array, " sources"],
    window: Int[Array, "m sources"],
    salts: UInt32[Array, " sources"],
    counts: Counts,
    n: int,
) -> Selection:
    """The ``n`` least candidates of the window (each source's next ``m`` rows)."""
    m, sources = window.shape
    table = window.astype(U32)
    ahead = jax.lax.associative_scan(jnp.add, table, axis=0) - table  # tokens before each row
    keys = relative[None, :] + ahead
    keys = jnp.where((keys < relative[None, :]) | (relative[None, :] == U32(PARKED)), U32(PARKED), keys)

    # the threshold lies between the least and the largest key at column ceil(n / sources) - 1:
    # below the least, every source has fewer keys; at the largest, every source has that many
    column = keys[-(-n // sources) - 1]
    enough = lambda limit: jnp.sum(keys <= limit, dtype=U32) >= U32(n)  # noqa: E731

    def probe(bounds):
        low, high = bounds  # the threshold is in [low, high]
        mid = low + (high - low) // U32(2)
        fits = enough(mid)
        return jnp.where(fits, low, mid + U32(1)), jnp.where(fits, mid, high)

    threshold, _ = jax.lax.while_loop(
        lambda bounds: bounds[0] < bounds[1], probe, (jnp.min(column), jnp.max(column))
    )
    at_most = jnp.sum(keys <= threshold, axis=0, dtype=U32)
    below = jnp.sum(keys < threshold, axis=0, dtype=U32)
    tied = at_most - below
    hashes = tie_hash(salts, base.lo + threshold)
    ids = jnp.arange(sources, dtype=U32)
    ahead_of = hashes[None, :] < hashes[:, None]
    first = ahead_of | ((hashes[None, :] == hashes[:, None]) & (ids[None, :] < ids[:, None]))
    queued = jnp.sum(jnp.where(first, tied[None, :], U32(0)), axis=1, dtype=U32)  # tied before s
    wanted = U32(n) - jnp.sum(below, dtype=U32)
    taken = below + jnp.clip(wanted - jnp.minimum(queued, wanted), U32(0), tied)

    ends = jnp.cumsum(taken, dtype=U32)
    rank = jnp.arange(n, dtype=U32)
    source = jnp.searchsorted(ends, rank, side="right", method="scan").astype(jnp.int32)
    nth = rank - (ends - taken)[source]
    key = keys[nth.astype(jnp.int32), source]
    order = two_pass_order(key, tie_hash(salts[source], base.lo + key))
    source, nth = source[order], nth[order]
    tokens = table[nth.astype(jnp.int32), source]
    given = jnp.arange(m, dtype=U32)[:, None] < taken[None, :]
    used = jnp.sum(jnp.where(given, table, U32(0)), axis=0, dtype=U32)
    return Selection(source, nth, taken, add64(counts, used), tokens.astype(jnp.int32))


def windows(sources: int, n: int) -> tuple[int, ...]:
    """The window widths tried in turn (static): ``4n/sources``, ``32n/sources`` (multiples of 8
    that leave at least ``n`` candidates), then ``n``."""
    widths = []
    for factor in (4, 32):
        width = -(-factor * n // sources)
        width = max(-(-width // 8) * 8, -(-n // sources))
        if width < n and (not widths or width > widths[-1]):
            widths.append(width)
    return (*widths, n)


@jax.jit
def select_merge(
    counts: Counts, row_tokens: Int[Array, "n sources"], salts: UInt32[Array, " sources"]
) -> Selection:
    """The least-consumed selection of ``n`` rows as a merge; equal to ``select_scan``'s.

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
    base, relative = _relative(counts)

    def attempt(widths: tuple[int, ...]) -> Selection:
        # the int32 table itself goes to the wider windows' branch (converting it all would
        # cost as much as the merge)
        picked = _merge(base, relative, row_tokens[: widths[0]], salts, counts, n)
        if len(widths) == 1:
            return picked
        final = jnp.max(picked.taken) < U32(widths[0])
        return jax.lax.cond(final, lambda: picked, lambda: attempt(widths[1:]))

    return attempt(windows(sources, n))
