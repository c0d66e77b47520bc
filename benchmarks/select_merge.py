"""The least-consumed interleave as a parallel k-way merge: ``select_tournament``'s picks, no loop.

The library's kernel is ``meshbatch.kernels.select_tournament``; this merge is the same picks
for a backend that wants parallel work, kept beside the benchmark that times it against the
tournament (``bench_mixture.py``) and checked equal to it by ``tests/kernels/test_interleave_merge.py``.

Source ``s``'s ``j``-th next row is picked when ``s`` stands at count ``key[s, j] = c_s +
(real tokens of its first j next rows)``: nondecreasing in ``j``. The scan picks, row after row,
the least ``(count, tie_hash(salt[s], count), s)`` among the sources' next rows; ordering every
candidate by ``(key, tie_hash(salt[s], key), s, j)`` makes each source's sequence strictly
increasing (a zero-token row repeats ``key`` and its hash, and ``j`` grows: a source tied with
itself keeps winning, as in the scan), so the scan's picks are the merge of those sequences,
i.e. the ``n`` smallest candidates in that order. The hand-worked trace of ``interleave_tree.py``
(a: 3 3 3, b: 5 5, c: 2 4 4, all at 0; hash b < a < c at 0 and a < c at 6):

    key    a: 0 3 6 9     b: 0 5 10     c: 0 2 6 10
    order  (0,b) (0,a) (0,c) (2,c) (3,a) (5,b) (6,a) (6,c) | (9,a) (10,..) ...
    n = 8  threshold T = 6: 6 keys below it, 2 of the tie at 6 taken (a before c by hash)

All parallel: prefix sums per source (an associative scan: XLA:CPU's ``cumsum`` is a reduce
window, twice as slow here), a bisection over the 32-bit threshold ``T`` (the least key with at
least ``n`` candidates at or below it, between the least and the largest key at column
``ceil(n / sources) - 1``; each probe one compare and sum), the tie at ``T`` taken by ``(hash,
source)``, then the picks' row order by ``(key, hash)`` (``two_pass_order`` below: two
single-array sorts, or the exact radix sort when the keys span too much). Keys are 32-bit
relative to the least count (``_relative``: a count 2^32 or more above it, or a key
that would pass 2^32 - 1, saturates and is never among the ``n`` least, since the least source
alone has ``n`` keys below ``n * max_row_tokens < 2^32 - 1``); the new counts are exact 64-bit
(two words).

Windows: a source takes about ``n / sources`` rows, so the merge first runs on each source's
next ``4n / sources`` rows, then ``32n / sources``, then all ``n``: a window's picks are final
when no source took all of its window (a source's later candidates follow its last one, which
``n`` smaller candidates already beat), else the next window decides (``lax.cond``: one runs).

The row order of the picks: the stable order of ``(key, hash)``, in two sorts when it can.
``select_merge`` knows which ``n`` candidates are picked; their rows go out in the order of
``(key, tie hash)``, ties in pick order (a source's own rows, then sources in index order). On
XLA:CPU a single-array sort of 4096 words takes about 60 to 130 us and one with a payload array
about five times that, so both ways below sort single arrays of ``digit * 2^b + place`` (``b``
bits hold a place) and read the order from the low bits; they are equal by construction:

* ``radix_order``: a least-significant-digit radix sort of the 64-bit ``key * 2^32 + hash``,
  ``32 - b`` bits a pass (three passes for keys under ``2^28``; a pass whose digits are all equal
  is skipped). Always exact.
* ``two_pass_order``: while the keys span under ``2^(32 - b)``, one pass by the hash's high
  ``32 - b`` bits, then one by ``key - least``: the order by ``(key, hash >> b, place)``. That is
  the order by ``(key, hash, place)`` unless two rows tied at a key share the hash's high bits
  and differ in its low ones; they then stand next to each other, which is checked, and the
  radix sort decides (``lax.cond``: one runs), as it does when the keys span too much.

Four picks with keys ``5 3 5 3`` and hashes ``9 7 2 7`` (places 0 .. 3): by the hash, places
``2 1 3 0``; then by the key (stable), ``1 3 2 0``: key 3 (hashes 7, 7: places in order), then
key 5 (hash 2 before 9).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, UInt32

from meshbatch.kernels import Counts, Selection, tie_hash
from meshbatch.kernels.mixtures.interleave_tree import PARKED, add64

U32 = jnp.uint32


def _relative(counts: Counts) -> tuple[Counts, UInt32[Array, " sources"]]:
    """The least count (``base``) and every count relative to it (``PARKED`` from 2^32 above)."""
    hi = jnp.min(counts.hi)
    base = Counts(hi, jnp.min(jnp.where(counts.hi == hi, counts.lo, U32(PARKED))))
    above = counts.hi - base.hi - (counts.lo < base.lo).astype(U32)  # exact: counts >= base
    return base, jnp.where(above > 0, U32(PARKED), counts.lo - base.lo)


def radix_order(key: UInt32[Array, " n"], hashes: UInt32[Array, " n"]) -> UInt32[Array, " n"]:
    """The stable order of ``(key, hashes)`` by single-array radix passes (always exact)."""
    n = key.shape[0]
    bits = max(1, (n - 1).bit_length())
    width = 32 - bits
    place = jnp.arange(n, dtype=U32)
    order = place
    for low in range(0, 64, width):
        if low + width <= 32:
            digit = hashes >> low
        elif low >= 32:
            digit = key >> (low - 32)
        else:
            digit = (hashes >> low) | (key << (32 - low))
        digit = digit & U32((1 << width) - 1)

        def sort_by(order, digit=digit):
            return order[jax.lax.sort((digit[order] << bits) | place) & U32((1 << bits) - 1)]

        order = jax.lax.cond(jnp.min(digit) == jnp.max(digit), lambda order: order, sort_by, order)
    return order


def _pass(order: UInt32[Array, " n"], digit: UInt32[Array, " n"], bits: int) -> UInt32[Array, " n"]:
    """``order`` stably sorted by ``digit[order]`` (digits under ``2^(32 - bits)``)."""
    place = jnp.arange(order.shape[0], dtype=U32)
    return order[jax.lax.sort((digit[order] << bits) | place) & U32((1 << bits) - 1)]


def two_pass_order(key: UInt32[Array, " n"], hashes: UInt32[Array, " n"]) -> UInt32[Array, " n"]:
    """The stable order of ``(key, hashes)``: two sorts when the keys span under ``2^(32 - b)``
    and the high ``32 - b`` bits of the hash tell every tie at a key apart; else
    ``radix_order``."""
    n = key.shape[0]
    bits = max(1, (n - 1).bit_length())
    least = jnp.min(key)

    def two_sorts(_):
        order = _pass(jnp.arange(n, dtype=U32), hashes >> bits, bits)
        order = _pass(order, key - least, bits)
        sk, sh = key[order], hashes[order]
        # rows tied at a key and at the hash's high bits stand together: they must hash alike
        blurred = (sk[1:] == sk[:-1]) & ((sh[1:] >> bits) == (sh[:-1] >> bits)) & (sh[1:] != sh[:-1])
        return jax.lax.cond(jnp.any(blurred), lambda: radix_order(key, hashes), lambda: order)

    fits = (jnp.max(key) - least) < U32(1 << (32 - bits)) if bits < 32 else jnp.asarray(False)
    return jax.lax.cond(fits, two_sorts, lambda _: radix_order(key, hashes), None)


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
