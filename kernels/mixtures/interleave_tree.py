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

The rule row by row (one ``lax.scan`` step, an argmin over every source), the tests' reference,
is ``tests/interleave_reference.py``. The pipeline's kernel, ``select_tournament``, is a
tournament, O(log sources) a row: a winner tree over the sources, each internal node holding the
source that goes first in its subtree by ``(count, tie_hash(salt[source], count), source)`` (the
rule: least consumed, then the keyed hash, then the lower index). The root is the row's pick; its
count grows by the row's tokens and its leaf-to-root path is played again, each level against the
sibling subtree's winner. The trace above on leaves ``a b c pad`` (a padding leaf never wins, see
below):

    row  takes  its count  the climb: sibling winner, then the other pair's      root after
    0    b      0 -> 5     a (0) over b (5); a over c, tied at 0, by hash        a
    1    a      0 -> 3     a (3) over b (5); c (0) over a (3)                    c
    2    c      0 -> 2     c (2) over pad;   c (2) over a (3)                    c
    3    c      2 -> 6     c (6) over pad;   a (3) over c (6)                    a
    4    a      3 -> 6     b (5) over a (6); b (5) over c (6)                    b
    5    b      5 -> 10    a (6) over b;     a over c, tied at 6, by hash        a
    6    a      6 -> 9     a (9) over b;     c (6) over a (9)                    c

The picks b a c c a b a c are the rule's (``tests/kernels/test_interleave_tree.py``). Only the row's
source's path changes: its siblings are read before any node on it is written, and the winner
climbs in registers.

How it runs: the pipeline plans on the host CPU, so the kernel is shaped for XLA:CPU. One
``lax.scan`` step per row, all scalar work on a small body, which XLA:CPU compiles into one native
loop (a larger body runs op by op, about a microsecond an op). Up to ``SINGLE_CLIMB`` levels (256
sources) a step climbs every level at once, straight-line code, the fastest form. XLA fuses the
chain of winners into every level's tree write, so a step's bytes grow faster than its levels;
to keep them small, each source keeps, beside its key, the key it will have after its next row
(``ahead``, made when it last won, from the table's next row and the tie hash): a step loads the
winner's key instead of reading its row's tokens and hashing, which also takes the hash and the
read off the row-to-row chain of dependent work. Above ``SINGLE_CLIMB`` levels a step climbs
``CHUNK`` levels per iteration of an inner loop and makes its key itself.

The table: ``row_tokens[j, s]``, a column per source. A row's read is row ``nth`` of its source,
and ``nth`` stays small (about ``n / sources``), so the batch's reads fall in the table's first
few rows, a few pages (a row per source would touch a page per source).

Inline: XLA:CPU runs a cheap program (by its flops estimate, a loop's body counted once) on the
caller's thread and hands any other to a worker thread, a costly hand-off. So every per-source
step is a scalar loop too, the new counts included: the estimate does not grow with the sources.
``bench_mixture.py --part compiled`` checks both properties of the compiled kernel; the figures
are in ``benchmarks/RESULTS.md`` ("Mixtures").

Counts: a pick's count stays below ``n * max_row_tokens``, so parked sources and the padding
leaves (parked, salt 0) never win (a parked source's key made ahead may wrap: it is never read).
The new counts are exact 64-bit (two words).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
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
CHUNK = 2  # levels a step climbs per inner-loop iteration (above SINGLE_CLIMB levels)
SINGLE_CLIMB = 8  # up to this many levels (256 sources) a step climbs all of them at once


def tree_levels(sources: int) -> int:
    """The tree's height: ``ceil(log2(sources))``, at least 2, rounded up to whole ``CHUNK``s
    above ``SINGLE_CLIMB`` (the extra leaves are padding that never wins)."""
    levels = max(2, (sources - 1).bit_length())
    return levels if levels <= SINGLE_CLIMB else levels + (-levels % CHUNK)


def _get(array: UInt32[Array, " m"], index: UInt32[Array, ""]) -> UInt32[Array, ""]:
    return lax.dynamic_index_in_dim(array, index, keepdims=False)


def _set(
    array: UInt32[Array, " m"], index: UInt32[Array, ""], value: UInt32[Array, ""]
) -> UInt32[Array, " m"]:
    return lax.dynamic_update_index_in_dim(array, value, index, 0)


def _key(keys: UInt32[Array, "leaves 2"], source: UInt32[Array, ""]) -> UInt32[Array, " 2"]:
    return lax.dynamic_slice(keys, (source, U32(0)), (1, 2))[0]


def _put_key(
    keys: UInt32[Array, "leaves 2"],
    source: UInt32[Array, ""],
    count: UInt32[Array, ""],
    hash_: UInt32[Array, ""],
) -> UInt32[Array, "leaves 2"]:
    return lax.dynamic_update_slice(keys, jnp.stack([count, hash_])[None], (source, U32(0)))


def _goes_first(a_count, a_hash, b_count, b_hash, a_left) -> jax.Array:
    """Whether source a goes before source b: lower count, then lower hash, then the left one
    (sources are numbered left to right, so the lower index). Scalars: XLA:CPU keeps them in
    registers inside the compiled loop."""
    return (a_count < b_count) | ((a_count == b_count) & ((a_hash < b_hash) | ((a_hash == b_hash) & a_left)))


def _climb(tree, keys, node, winner, count, hash_, levels: int):
    """``levels`` levels up from ``node``, whose subtree's winner is now ``winner`` (at ``count``,
    ``hash_``): every sibling's winner read first (no node on the way is written yet), then each
    level's winner, and the node above written with it. Returns the tree and the winner's
    ``(source, count, hash)``."""
    nodes = [node >> U32(level) for level in range(levels)]
    # one spare slot: an update covering the whole array would be folded into a plain value,
    # and the siblings must be read before the tree is written
    siblings = jnp.zeros(levels + 1, U32)
    for level, at in enumerate(nodes):
        siblings = _set(siblings, U32(level), _get(tree, at ^ U32(1)))
    for level, at in enumerate(nodes):
        sibling = _get(siblings, U32(level))
        key = _key(keys, sibling)
        ours = _goes_first(count, hash_, key[0], key[1], (at & U32(1)) == U32(0))
        winner = jnp.where(ours, winner, sibling)
        count = jnp.where(ours, count, key[0])
        hash_ = jnp.where(ours, hash_, key[1])
        tree = _set(tree, at >> U32(1), winner)
    return tree, winner, count, hash_


@jax.jit
def select_tournament(
    counts: Counts, row_tokens: Int[Array, "n sources"], salts: UInt32[Array, " sources"]
) -> Selection:
    """The least-consumed selection of ``n`` rows (the module docstring's rule), a tournament-tree
    climb per row. Jitted; a table's shape compiles once.

    Args:
        counts: consumed tokens per source at the start of the batch.
        row_tokens: ``int32[n, sources]`` real tokens of each source's next ``n`` rows (column
            ``s`` is source ``s``'s), each in ``[0, max_row_tokens]`` with
            ``n * max_row_tokens < 2^32 - 1`` (and, int32, ``max_row_tokens < 2^31``).
        salts: ``uint32[sources]`` distinct tie-break salts (``source_salts``, ``named_salts``).

    Returns:
        The ``Selection``: each row's source and which of its next rows, and the new counts.
    """
    n, sources = row_tokens.shape
    if n == 0:  # nothing to pick (static: the table's shape)
        empty = jnp.zeros(0, jnp.int32)
        return Selection(empty, jnp.zeros(0, U32), jnp.zeros(sources, U32), counts, empty)
    levels = tree_levels(sources)
    leaves = 1 << levels

    def least(s, best):  # the least count, 64-bit (scalar loops compile to one native loop)
        hi, lo = _get(counts.hi, s), _get(counts.lo, s)
        less = (hi < best[0]) | ((hi == best[0]) & (lo < best[1]))
        return jnp.where(less, hi, best[0]), jnp.where(less, lo, best[1])

    base = Counts(*lax.fori_loop(U32(1), U32(sources), least, (counts.hi[0], counts.lo[0])))

    def leaf_key(leaf):
        """A leaf's (count relative to ``base``, hash): a source's, or a padding leaf's (parked)."""
        hi, lo = _get(counts.hi, leaf), _get(counts.lo, leaf)
        above = hi - base.hi - (lo < base.lo).astype(U32)  # exact: counts >= base
        count = jnp.where((above > U32(0)) | (leaf >= U32(sources)), U32(PARKED), lo - base.lo)
        salt = jnp.where(leaf < U32(sources), _get(salts, leaf), U32(0))
        return jnp.stack([count, tie_hash(salt, base.lo + count)])

    def build(k, state):
        """Node ``leaves - k`` (bottom up): the keys of its two leaves first when its children are
        leaves, then the winner of its children."""
        keys, tree = state
        node = U32(leaves) - k
        pair = lax.dynamic_slice(tree, (U32(2) * node,), (2,))
        bottom = node >= U32(leaves // 2)
        for child in (pair[0], pair[1]):  # above the bottom level, rewrites a key with itself
            row = jnp.where(bottom, leaf_key(child), _key(keys, child))
            keys = lax.dynamic_update_slice(keys, row[None], (child, U32(0)))
        a, b = _key(keys, pair[0]), _key(keys, pair[1])
        left = _goes_first(a[0], a[1], b[0], b[1], jnp.asarray(True))
        return keys, _set(tree, node, jnp.where(left, pair[0], pair[1]))

    # node i < leaves holds its subtree's winner (children 2i, 2i + 1); leaf leaves + s holds s
    tree = jnp.concatenate([jnp.zeros(leaves, U32), jnp.arange(leaves, dtype=U32)])
    keys, tree = lax.fori_loop(U32(1), U32(leaves), build, (jnp.zeros((leaves, 2), U32), tree))
    first = tree[1]

    def token(j: UInt32[Array, ""], s: UInt32[Array, ""]) -> UInt32[Array, ""]:
        """Row ``j`` of source ``s`` (clamped to the table's last row)."""
        return lax.dynamic_slice(row_tokens, (j, s), (1, 1))[0, 0].astype(U32)

    def prime(s, ahead):
        """Source ``s``'s key once its next row (the table's first) is taken."""
        count = _key(keys, s)[0] + token(U32(0), s)
        return _put_key(ahead, s, count, tie_hash(_get(salts, s), base.lo + count))

    def step(carry, _):
        keys, ahead, taken, tree, winner, winner_count = carry
        taken = _set(taken, winner, _get(taken, winner) + U32(1))
        nth = _get(taken, winner) - U32(1)  # read after the write: no copy of ``taken``
        tokens = token(nth, winner)
        leaf = winner + U32(leaves)
        if levels <= SINGLE_CLIMB:
            # its key after this row, made when it last won (or by ``prime``): read back from
            # ``keys`` after the write, so nothing reads ``ahead`` once it is rewritten (no copy)
            made = lax.dynamic_slice(ahead, (winner, U32(0)), (1, 2))
            keys = lax.dynamic_update_slice(keys, made, (winner, U32(0)))
            now = _key(keys, winner)
            count, hash_ = now[0], now[1]
            # its key after its next row; after its last row of the table the read is clamped, and
            # the key is never used (no row is left to take)
            later = count + token(nth + U32(1), winner)
            ahead = _put_key(ahead, winner, later, tie_hash(_get(salts, winner), base.lo + later))
            tree, winner_next, _, _ = _climb(tree, keys, leaf, winner, count, hash_, levels)
        else:
            count = winner_count + tokens
            hash_ = tie_hash(_get(salts, winner), base.lo + count)
            keys = _put_key(keys, winner, count, hash_)

            def chunk(_, state):
                tree, node, winner, count, hash_ = state
                tree, winner, count, hash_ = _climb(tree, keys, node, winner, count, hash_, CHUNK)
                return tree, node >> U32(CHUNK), winner, count, hash_

            state = (tree, leaf, winner, count, hash_)
            tree, _, winner_next, winner_count, _ = lax.fori_loop(0, levels // CHUNK, chunk, state)
        carry = (keys, ahead, taken, tree, winner_next, winner_count)
        return carry, (winner.astype(jnp.int32), nth, tokens.astype(jnp.int32))

    if levels <= SINGLE_CLIMB:  # each source's key after its next row; no count carried
        ahead, count = lax.fori_loop(U32(0), U32(sources), prime, jnp.zeros((leaves, 2), U32)), None
    else:  # the winner's count carried; no keys ahead
        ahead, count = None, keys[first, 0]
    carry = (keys, ahead, jnp.zeros(leaves, U32), tree, first, count)
    (keys, _, taken, _, _, _), (source, nth, tokens) = lax.scan(step, carry, None, length=n)

    def absolute(s, new):
        """Source ``s``'s count after the batch: ``base`` plus its relative count, exact (a
        parked source keeps its count)."""
        hi, lo = new
        relative = _key(keys, s)[0]
        after, parked = add64(base, relative), relative == U32(PARKED)
        high, low = jnp.where(parked, _get(hi, s), after.hi), jnp.where(parked, _get(lo, s), after.lo)
        return _set(hi, s, high), _set(lo, s, low)

    # a scalar loop, not an elementwise step over the sources: see "Inline" above
    new = Counts(*lax.fori_loop(U32(0), U32(sources), absolute, (counts.hi, counts.lo)))
    return Selection(source, nth, taken[:sources], new, tokens)
