"""The tournament form of the least-consumed selection (the pipeline's kernel): equal to the heap
reference at hundreds of sources, traced without a sort or a scatter. How XLA:CPU compiles it (its
loops native, its call on the caller's thread) is checked by ``bench_mixture.py --part compiled``,
not here: that output changes with jax, not with behaviour.

The small shapes, the hand-worked trace and carried batches run in ``test_interleave.py`` (beside
the scan) and ``test_interleave_merge.py`` (beside the merge)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mixture_reference import as_ints, counts_of, least_consumed

from meshbatch.kernels import select_tournament, source_salts
from meshbatch.kernels.mixtures.interleave_tree import CHUNK, SINGLE_CLIMB, tree_levels

U32 = jnp.uint32


def test_tree_levels():
    """At least two levels; above ``SINGLE_CLIMB``, whole chunks (the padding leaves never win)."""
    assert (SINGLE_CLIMB, CHUNK) == (8, 2)
    sources = (1, 2, 3, 4, 5, 16, 17, 33, 64, 65, 128, 129, 256, 300, 1000)
    assert [tree_levels(s) for s in sources] == [2, 2, 2, 2, 3, 4, 5, 6, 6, 7, 7, 8, 8, 10, 10]


CASES = [(64, 200), (100, 150), (256, 300), (1000, 48)]  # (sources, rows): four compiles


@pytest.mark.parametrize("case", range(8))
def test_equals_heap_at_hundreds_of_sources(case):
    """Every pick and the final 64-bit counts equal the heap reference: zero-token rows and whole
    zero sources, equal rows (every source tied at every count), counts carrying into ``hi``, a
    source parked 2^40 above and one 2^32 - 5 above (its keys saturate), padding leaves."""
    sources, n = CASES[case % 4]
    rng = np.random.default_rng(case)
    if case >= 4:
        tokens = np.full((sources, n), 4096)  # causal windows: every row seq_len tokens, ties always
        counts = [7 << 32] * sources
    else:
        tokens = rng.integers(0, 5000, (sources, n)) * rng.integers(0, 2, (sources, n))
        tokens[rng.integers(0, sources)] = 0  # a source of empty rows keeps winning while tied
        base = int(rng.integers(0, 3)) << 32
        counts = [base + 2**32 - int(rng.integers(0, 10_000)) for _ in range(sources)]
        counts[1] += 2**40
        counts[2] = min(counts) + 2**32 - 5
    salt = source_salts(U32(case), sources)
    out = select_tournament(counts_of(counts), jnp.asarray(tokens.T, jnp.int32), salt)
    rows, final = least_consumed(counts, tokens, [int(s) for s in np.asarray(salt)])
    assert list(zip(np.asarray(out.source).tolist(), np.asarray(out.nth).tolist(), strict=True)) == rows
    assert np.asarray(out.tokens).tolist() == [int(tokens[s, j]) for s, j in rows]
    assert np.asarray(out.taken).tolist() == np.bincount([s for s, _ in rows], minlength=sources).tolist()
    assert as_ints(out.counts) == final
    if case >= 4:  # ties broken by the keyed hash, not by index: every source leads some round
        firsts = np.asarray(out.source)[: (n // sources) * sources].reshape(-1, sources)[:, 0]
        assert len(set(firsts.tolist())) == len(firsts)


def test_one_source_takes_most_rows():
    """One source of 1-token rows among 63 of long ones takes nearly every row (its whole table)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(1000, 4097, (64, 256))
    tokens[17] = 1
    salt = source_salts(U32(3), 64)
    out = select_tournament(counts_of([0] * 64), jnp.asarray(tokens.T, jnp.int32), salt)
    rows, final = least_consumed([0] * 64, tokens, [int(s) for s in np.asarray(salt)])
    assert list(zip(np.asarray(out.source).tolist(), np.asarray(out.nth).tolist(), strict=True)) == rows
    assert int(np.asarray(out.taken)[17]) > 180 and as_ints(out.counts) == final


def test_one_source_and_no_rows():
    out = select_tournament(counts_of([5]), jnp.asarray([[3], [0], [2]], jnp.int32), source_salts(U32(0), 1))
    assert np.asarray(out.source).tolist() == [0, 0, 0] and as_ints(out.counts) == [10]
    empty = select_tournament(counts_of([5, 9]), jnp.zeros((0, 2), jnp.int32), source_salts(U32(0), 2))
    assert np.asarray(empty.source).shape == (0,) and as_ints(empty.counts) == [5, 9]


def test_a_source_that_takes_its_whole_column():
    """A source of empty rows below the rest takes every row of its column; its key for a row
    past the table's end (made when it takes the last one) is never used. At one climb and at
    chunks: 3 and 300 sources."""
    for sources in (3, 300):
        tokens = np.full((sources, 5), 7)
        tokens[1] = 0
        counts = [9] * sources
        counts[1] = 8
        salt = source_salts(U32(5), sources)
        out = select_tournament(counts_of(counts), jnp.asarray(tokens.T, jnp.int32), salt)
        rows, final = least_consumed(counts, tokens, [int(s) for s in np.asarray(salt)])
        assert [s for s, _ in rows] == [1] * 5 and list(
            zip(np.asarray(out.source).tolist(), np.asarray(out.nth).tolist(), strict=True)
        ) == rows
        assert as_ints(out.counts) == final


def test_jaxpr_has_no_sort_and_no_scatter():
    """One climb a row: no sort, no scatter (XLA:CPU would not compile a scatter into the loop)."""
    args = (counts_of([0] * 40), jnp.zeros((16, 40), jnp.int32), source_salts(U32(0), 40))
    jaxpr = str(jax.make_jaxpr(select_tournament)(*args))
    assert "sort" not in jaxpr and "scatter" not in jaxpr
