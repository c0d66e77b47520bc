"""The merge form of the least-consumed selection (``benchmarks/select_merge.py``, which the benchmark
times against the pipeline's tournament): equal to the scan, the tournament and the heap, bit for
bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiles import count_compiles
from interleave_reference import merge, select_merge, select_scan
from mixture_reference import counts_of, least_consumed

from meshbatch.datasets.mixtures import token_balanced
from meshbatch.kernels import select_tournament, source_salts

windows = merge.windows

U32 = jnp.uint32


def assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_hand_worked_trace():
    """The docstring's trace: a 3 3 3, b 5 5, c 2 4 4 from 0, seed 4; 8 rows, threshold 6."""
    tokens = jnp.asarray([[3] * 8, [5] * 8, [2] + [4] * 7], jnp.int32)
    out = select_merge(counts_of([0, 0, 0]), tokens.T, source_salts(U32(4), 3))  # a column a source
    assert np.asarray(out.source).tolist() == [1, 0, 2, 2, 0, 1, 0, 2]
    assert np.asarray(out.nth).tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert np.asarray(out.tokens).tolist() == [5, 3, 2, 4, 3, 5, 3, 4]


@pytest.mark.parametrize("case", range(24))
def test_equals_scan_and_heap(case):
    """Four shapes (1 .. 24 sources, n from 7 to 96), zero-token rows and whole zero sources,
    equal row lengths (ties at every level), counts carrying into ``hi``, a source parked 2^40
    above, one 2^32 - 5 above (its keys saturate)."""
    rng = np.random.default_rng(case)
    sources, n = ((1, 7), (3, 96), (8, 96), (24, 64))[case % 4]  # four shapes: four compiles
    tokens = rng.integers(0, 6, (sources, n)) * rng.integers(0, 2, (sources, n))
    tokens += rng.integers(0, 2, (sources, 1)) * int(rng.integers(0, 40))
    if case % 8 == 2:
        tokens[:] = 16  # every source at every level tied
    if case % 6 == 1:
        tokens[0] = 0  # a source tied with itself keeps winning
    base = int(rng.integers(0, 3)) << 32
    counts = [base + 2**32 - int(rng.integers(0, 30)) for _ in range(sources)]
    if case % 2:
        counts[0] += 2**40
    if case % 3 == 0 and sources > 1:
        counts[-1] = min(counts) + 2**32 - 5
    salt = source_salts(U32(case % 5), sources)
    args = (counts_of(counts), jnp.asarray(tokens.T, jnp.int32), salt)
    merged = select_merge(*args)
    assert_same(merged, select_scan(*args))
    assert_same(merged, select_tournament(*args))
    rows, final = least_consumed(counts, tokens, [int(s) for s in np.asarray(salt)])
    assert list(zip(np.asarray(merged.source).tolist(), np.asarray(merged.nth).tolist(), strict=True)) == rows
    hi, lo = np.asarray(merged.counts.hi), np.asarray(merged.counts.lo)
    assert [(int(h) << 32) + int(w) for h, w in zip(hi, lo, strict=True)] == final


def test_windows_fall_back_exactly():
    """Balanced rows stay in the first window; one source with 1-token rows among long ones
    takes far more than its window: the wider windows decide, still equal to the heap."""
    rng = np.random.default_rng(0)
    sources, n = 64, 256
    tokens = rng.integers(1000, 4097, (sources, n))
    salt = source_salts(U32(1), sources)
    salt_list = [int(s) for s in np.asarray(salt)]
    for skewed in (False, True):
        if skewed:
            tokens[sources // 2] = 1
        out = select_merge(counts_of([0] * sources), jnp.asarray(tokens.T, jnp.int32), salt)
        rows, final = least_consumed([0] * sources, tokens, salt_list)
        picks = zip(np.asarray(out.source).tolist(), np.asarray(out.nth).tolist(), strict=True)
        assert list(picks) == rows
        assert (int(np.asarray(out.taken).max()) > windows(sources, n)[0]) == skewed
        assert np.asarray(out.counts.lo).tolist() == final


def test_windows():
    assert windows(4, 4096) == (4096,)
    assert windows(64, 4096) == (256, 2048, 4096)
    assert windows(256, 4096) == (64, 512, 4096)
    assert windows(3, 1) == (1,)


def test_never_recompiles():
    steps = [
        (counts_of([s, 2**33, 7, 0, 2**40]), jnp.full((32, 5), s, jnp.int32), source_salts(U32(s), 5))
        for s in range(4)
    ]
    jax.block_until_ready(select_merge(*steps[0]))
    with count_compiles() as compiles:
        for step in steps[1:]:
            jax.block_until_ready(select_merge(*step))
    assert compiles == []


def test_the_pipelines_kernel_is_the_tournament():
    """The token-balanced mixture calls the tournament, at every number of sources (one compile a
    shape), and the merge picks what it picks."""
    assert token_balanced.select_tournament is select_tournament
    for sources in (3, 29, 64):
        tokens = jnp.asarray(np.random.default_rng(sources).integers(0, 9, (41, sources)), jnp.int32)
        args = (counts_of([0] * sources), tokens, source_salts(U32(2), sources))
        compiled = select_tournament._cache_size()
        out = select_tournament(*args)
        assert select_tournament._cache_size() == compiled + 1
        assert_same(out, select_merge(*args))
