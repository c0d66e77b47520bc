"""The least-consumed selection kernels: a hand-worked trace, a heap reference, balance, carry.

Each test runs the scan (the rule literally, ``interleave_reference.py``) and the tournament (the
pipeline's kernel); the merge is checked against both in ``test_interleave_merge.py``."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from interleave_reference import select_merge, select_scan
from mixture_reference import as_ints, counts_of, least_consumed, salts, tie_hash

from meshbatch.kernels import select_tournament, source_salts

KERNELS = pytest.mark.parametrize("select", [select_scan, select_tournament], ids=["scan", "tournament"])

U32 = jnp.uint32


@KERNELS
def test_hand_worked_trace(select):
    """Must-show 2, literally (the trace in kernels/mixtures/interleave_tree.py's docstring).

    Sources a, b, c; next rows a: 3 3 3 .., b: 5 5 .., c: 2 4 4 ..; seed 4, whose tie-break
    order is b < a < c at count 0 and a < c at count 6.

        row  counts (a, b, c)  least          takes
        0    (0, 0, 0)         a, b, c tied   b  +5
        1    (0, 5, 0)         a, c tied      a  +3
        2    (3, 5, 0)         c              c  +2
        3    (3, 5, 2)         c              c  +4
        4    (3, 5, 6)         a              a  +3
        5    (6, 5, 6)         b              b  +5
        6    (6, 10, 6)        a, c tied      a  +3
        7    (9, 10, 6)        c              c  +4     -> (9, 10, 10)
    """
    salt = [int(s) for s in np.asarray(source_salts(U32(4), 3))]
    assert salt == salts(4, 3)  # the kernel's salts equal the reference's formula
    at0 = [tie_hash(s, 0) for s in salt]
    at6 = [tie_hash(s, 6) for s in salt]
    assert at0[1] < at0[0] < at0[2] and at6[0] < at6[2]
    tokens = jnp.asarray([[3] * 8, [5] * 8, [2] + [4] * 7], jnp.int32)
    out = select(counts_of([0, 0, 0]), tokens.T, source_salts(U32(4), 3))  # a column per source
    assert np.asarray(out.source).tolist() == [1, 0, 2, 2, 0, 1, 0, 2]
    assert np.asarray(out.nth).tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert np.asarray(out.tokens).tolist() == [5, 3, 2, 4, 3, 5, 3, 4]
    assert np.asarray(out.taken).tolist() == [3, 2, 3]
    assert as_ints(out.counts) == [9, 10, 10]


@KERNELS
def test_ties_are_not_first_wins(select):
    """Equal sources at equal counts: every source leads some round (not always source 0)."""
    tokens = jnp.ones((64, 4), jnp.int32)
    out = select(counts_of([0] * 4), tokens, source_salts(U32(1), 4))
    firsts = np.asarray(out.source).reshape(16, 4)[:, 0]  # who wins each tied round
    assert set(firsts.tolist()) == {0, 1, 2, 3}
    assert (np.sort(np.asarray(out.source).reshape(16, 4), axis=1) == np.arange(4)).all()


def fmix32_inverse(h: int) -> int:
    """The ``x`` with ``fmix32(x) == h`` (murmur3's finaliser undone step by step)."""
    m = 0xFFFFFFFF
    h ^= h >> 16
    h = (h * pow(0xC2B2AE35, -1, 2**32)) & m
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * pow(0x85EBCA6B, -1, 2**32)) & m
    return h ^ (h >> 16)


@KERNELS
def test_a_tied_source_whose_hash_is_all_ones_still_wins(select):
    """Source 1 is alone at the least count and its tie hash is 0xFFFFFFFF (the salt is chosen by
    inverting fmix32): it is taken, not source 0, which is above it and was masked to that value."""
    salt = np.array([12345, fmix32_inverse(0xFFFFFFFF)], np.uint32)  # tie_hash(s, 0) = fmix32(s)
    assert tie_hash(int(salt[1]), 0) == 0xFFFFFFFF
    tokens = jnp.full((2, 4), 10, jnp.int32)
    out = select(counts_of([5, 0]), tokens.T, jnp.asarray(salt))
    assert np.asarray(out.source).tolist() == [1, 0, 1, 0]  # counts (5,0) -> (5,10) -> (15,10) -> ...
    assert as_ints(out.counts) == [25, 20]
    picks, final = least_consumed([5, 0], np.asarray(tokens), [int(s) for s in salt])
    assert [s for s, _ in picks] == np.asarray(out.source).tolist() and final == [25, 20]
    merged = select_merge(counts_of([5, 0]), tokens.T, jnp.asarray(salt))  # the merge agrees
    assert np.asarray(merged.source).tolist() == [1, 0, 1, 0]


@KERNELS
@pytest.mark.parametrize("seed", range(8))
def test_equals_heap_reference(select, seed):
    rng = np.random.default_rng(seed)
    sources, n = (1, 3, 8)[seed % 3], 96  # three shapes: three compiles
    tokens = rng.integers(0, 6, (sources, n)) + rng.integers(0, 2, (sources, 1)) * 7  # zeros included
    base = int(rng.integers(0, 3)) << 32
    counts = [base + (2**32 - int(rng.integers(0, 30))) for _ in range(sources)]  # carries into hi
    if seed % 2:
        counts[0] += 2**40  # far above the rest: parked for the whole batch
    salt = source_salts(U32(seed), sources)
    out = select(counts_of(counts), jnp.asarray(tokens.T, jnp.int32), salt)
    rows, final = least_consumed(counts, tokens, [int(s) for s in np.asarray(salt)])
    assert list(zip(np.asarray(out.source).tolist(), np.asarray(out.nth).tolist(), strict=True)) == rows
    assert as_ints(out.counts) == final


@KERNELS
def test_carried_batches_equal_one_batch(select):
    """Two batches with the state carried between them select exactly what one batch would."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(1, 50, (5, 256))
    salt = source_salts(U32(4), 5)
    whole = select(counts_of([0] * 5), jnp.asarray(tokens.T, jnp.int32), salt)
    first = select(counts_of([0] * 5), jnp.asarray(tokens[:, :128].T, jnp.int32), salt)
    taken = np.asarray(first.taken)
    rest = np.stack([tokens[s, taken[s] : taken[s] + 128] for s in range(5)])
    second = select(first.counts, jnp.asarray(rest.T, jnp.int32), salt)
    sources = np.concatenate([np.asarray(first.source), np.asarray(second.source)])
    nth = np.concatenate([np.asarray(first.nth), np.asarray(second.nth) + taken[np.asarray(second.source)]])
    assert (sources == np.asarray(whole.source)[:256]).all() and (nth == np.asarray(whole.nth)).all()
    assert as_ints(second.counts) == as_ints(whole.counts)


@KERNELS
def test_balance_over_1e5_rows(select):
    """Must-show 2: over 10^5 rows (25 carried batches of 4096) the consumed-token counts of all
    sources stay within one maximum row length of each other, after every row."""
    rng = np.random.default_rng(0)
    sources, n, max_row = 6, 4096, 2048
    low = np.array([1, 1, 512, 1000, 2000, 2048])  # different row-length distributions per source
    counts = counts_of([0] * sources)
    salt = source_salts(U32(0), sources)
    spread = []
    totals = np.zeros(sources, np.int64)
    for _ in range(25):
        tokens = rng.integers(low[:, None], max_row + 1, (sources, n))
        out = select(counts, jnp.asarray(tokens.T, jnp.int32), salt)
        running = totals[None, :] + np.cumsum(
            np.eye(sources, dtype=np.int64)[np.asarray(out.source)] * np.asarray(out.tokens)[:, None], axis=0
        )
        spread.append(int((running.max(axis=1) - running.min(axis=1)).max()))
        totals = running[-1]
        counts = out.counts
    assert as_ints(counts) == totals.tolist()
    assert max(spread) <= max_row
    chex.assert_type(out.source, jnp.int32)


@KERNELS
def test_never_recompiles(select):
    tokens = jnp.ones((32, 3), jnp.int32)
    select(counts_of([0, 0, 0]), tokens, source_salts(U32(0), 3))
    before = select._cache_size()
    for seed in range(3):
        select(counts_of([seed, 2**33, 7]), tokens * (seed + 1), source_salts(U32(seed), 3))
    assert select._cache_size() == before
