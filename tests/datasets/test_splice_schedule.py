"""Enumerated splice schedules (anchor_start, slide_within, cyclic_roll, slide) and their integer helpers.

Every schedule here holds many documents of awkward lengths at once (L = 1, 2, 3, L < K, L = S,
L > S), so one compilation covers them all; each is compared, row by row, with the naive
enumeration in ``test_splice_reference``.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from splice_reference import ref_pairs, ref_pass_order, ref_quotas

import meshbatch
from meshbatch.kernels.splice.splice_rows import interleave, lookup_rows, search_last
from meshbatch.kernels.uint32 import muldiv

LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 31]
U32 = jnp.uint32


def all_rows(schedule, epoch=0):
    doc, t, s, copy_len = schedule.lookup(np.arange(len(schedule), dtype=np.uint32), epoch)
    return list(zip(*(np.asarray(x).tolist() for x in (doc, t, s, copy_len)), strict=True))


def reference(lengths, **kw):
    return [(d, *pair) for d, L in enumerate(lengths) for pair in ref_pairs(L, **kw)]


# (seq_len, content_length, content_stride, offset_stride): small S, K = None, K < S, K = S, K > S, strides.
CONFIGS = [
    (2, None, 1, 1),
    (3, 2, 1, 1),
    (5, 3, 1, 1),
    (5, None, 1, 1),
    (8, 8, 1, 1),
    (8, 3, 2, 1),
    (8, 5, 1, 3),
    (9, 12, 3, 2),
    (16, None, 4, 5),
    (7, 2, 5, 7),
]


@pytest.mark.parametrize("mode", ["anchor_start", "slide_within", "cyclic_roll"])
@pytest.mark.parametrize(("seq_len", "content_length", "content_stride", "offset_stride"), CONFIGS)
def test_enumerated_schedule_equals_reference(mode, seq_len, content_length, content_stride, offset_stride):
    spec = dict(seq_len=seq_len, content_length=content_length, content_start_mode=mode)
    strides = dict(content_stride=content_stride, offset_stride=offset_stride)
    if mode == "anchor_start":
        strides.pop("content_stride")  # anchor_start has one start; a t stride is meaningless there
    schedule = meshbatch.splice_schedule(LENGTHS, **spec, **strides)
    kw = dict(S=seq_len, K=content_length, kt=content_stride, ks=offset_stride, start_mode=mode)
    want = reference(LENGTHS, **kw)
    assert len(schedule) == len(want)
    assert all_rows(schedule) == want  # every valid pair exactly once, in the seed's default order


@pytest.mark.parametrize(("seq_len", "content_length", "content_stride", "offset_stride"), CONFIGS)
def test_pair_count_formula(seq_len, content_length, content_stride, offset_stride):
    """``Σ_t (S - min(K, L - t)) // k_s + 1`` over strided t, pruned where ``copy_len < 2``."""
    S, kt, ks = seq_len, content_stride, offset_stride
    for L in LENGTHS:
        K = L if content_length is None else content_length
        formula = sum(
            max(0, S - min(K, L - t)) // ks + 1 for t in range(0, L, kt) if min(K, L - t, S) >= 2
        )  # max(0, .) only matters when min(K, L - t) > S: then the one placement s = 0 copies S tokens
        if min(K, L) <= S:
            assert formula == sum(
                (S - min(K, L - t)) // ks + 1 for t in range(0, L, kt) if min(K, L - t) >= 2
            )  # the seed's formula verbatim
        schedule = meshbatch.splice_schedule(
            [L], seq_len=S, content_length=content_length, content_stride=kt, offset_stride=ks,
            content_start_mode="slide_within",
        ) if formula else None  # fmt: skip
        if schedule is not None:
            assert len(schedule) == formula, L


def test_seed_count_example():
    assert (
        len(meshbatch.splice_schedule([5], seq_len=5, content_length=3, content_start_mode="slide_within"))
        == 13
    )


@pytest.mark.parametrize("window_stride", [1, 2, 5])
def test_slide_mode_equals_reference(window_stride):
    schedule = meshbatch.splice_schedule(LENGTHS, seq_len=4, mode="slide", window_stride=window_stride)
    assert all_rows(schedule) == reference(LENGTHS, S=4, kw=window_stride, start_mode="slide")


def test_min_copy_len_prunes_short_copies():
    schedule = meshbatch.splice_schedule(
        LENGTHS, seq_len=9, content_length=6, content_start_mode="slide_within", min_copy_len=4
    )
    want = reference(LENGTHS, S=9, K=6, m=4, start_mode="slide_within")
    assert all_rows(schedule) == want
    assert min(row[3] for row in want) == 4


@pytest.mark.parametrize(
    ("balance_mode", "tau", "epoch_length"),
    [
        ("by_document", 1.0, None),
        ("by_document", 1.0, 50),
        ("by_temperature", 1.0, 101),
        ("by_temperature", 0.0, 64),
        ("by_coverage", 1.0, 77),
    ],
)
def test_enumerated_quotas_spread_pairs_pass_by_pass(balance_mode, tau, epoch_length):
    lengths = [3, 9, 2, 6]
    kw = dict(S=6, K=3, start_mode="slide_within")
    pairs = [ref_pairs(L, **kw) for L in lengths]
    schedule = meshbatch.splice_schedule(
        lengths, seq_len=6, content_length=3, content_start_mode="slide_within", balance_mode=balance_mode,
        balance_tau=tau, epoch_length=epoch_length,
    )  # fmt: skip
    counts = [len(p) for p in pairs]
    if balance_mode == "by_document":
        weights = [int(c > 0) for c in counts]
        total = epoch_length or sum(weights) * max(counts)
    elif balance_mode == "by_coverage":
        weights, total = counts, epoch_length
    else:
        weights, total = [L**tau if c else 0 for L, c in zip(lengths, counts, strict=True)], epoch_length
    quotas = ref_quotas(weights, total)
    assert meshbatch.pairs_per_doc(schedule).tolist() == quotas
    want = []
    for d, (q, p) in enumerate(zip(quotas, pairs, strict=True)):
        want += [(d, *p[((2 * j + 1) * len(p)) // (2 * q)]) for j in ref_pass_order(q, len(p))]
    assert all_rows(schedule) == want


def test_epochs_repeat_without_shuffle_and_lookup_never_recompiles():
    schedule = meshbatch.splice_schedule(
        LENGTHS, seq_len=8, content_length=3, content_start_mode="slide_within"
    )
    other = meshbatch.splice_schedule(
        [L + 1 for L in LENGTHS], seq_len=8, content_length=3, content_start_mode="slide_within"
    )

    @jax.jit
    @chex.assert_max_traces(n=1)
    def plan(schedule, rows, epoch):
        return lookup_rows(schedule, rows, epoch)

    rows = jnp.arange(16, dtype=U32)
    first = plan(schedule, rows, U32(0))
    for epoch in (1, 2, 7):
        chex.assert_trees_all_equal(plan(schedule, rows, U32(epoch)), first)
    plan(schedule, rows + U32(5), U32(3))
    plan(other, rows, U32(0))  # same table shapes: a new document set reuses the compiled plan


# --- integer helpers ---------------------------------------------------------------------------


def test_muldiv_is_exact_on_32_bit_extremes():
    rng = np.random.default_rng(0)
    c = rng.integers(1, 2**32, 2000, dtype=np.uint64)
    a = rng.integers(0, 2**32, 2000, dtype=np.uint64)
    b = (rng.integers(0, 2**32, 2000, dtype=np.uint64) * c) >> np.uint64(32)  # keeps a*b/c < 2^32
    add = rng.integers(0, 2**32, 2000, dtype=np.uint64)
    edge = np.array(
        [[0, 0, 0, 1], [2**32 - 1, 1, 0, 2**32 - 1], [2**32 - 1, 2**32 - 1, 2**32 - 1, 2**32 - 1]]
    )
    a, b, add, c = (np.concatenate([x, edge[:, i].astype(np.uint64)]) for i, x in enumerate((a, b, add, c)))
    want = [(int(x) * int(y) + int(z)) // int(w) for x, y, z, w in zip(a, b, add, c, strict=True)]
    ok = [v < 2**32 for v in want]
    got = np.asarray(muldiv(*(jnp.asarray(x.astype(np.uint32)) for x in (a, b, add, c))))
    assert [int(g) for g, k in zip(got, ok, strict=True) if k] == [v for v in want if v < 2**32]


@pytest.mark.parametrize("quota", [1, 2, 3, 5, 8, 13, 64, 100])
@pytest.mark.parametrize("items", [1, 2, 3, 7, 16, 99])
def test_interleave_is_the_pass_order(quota, items):
    r = jnp.arange(quota, dtype=U32)
    got = np.asarray(interleave(r, jnp.full(quota, quota, U32), jnp.full(quota, items, U32))).tolist()
    assert got == ref_pass_order(quota, items)


def test_interleave_near_2_to_32():
    quota, items = 2**32 - 1, 3_000_000_000
    r = np.array([0, 1, 2, 1_499_999_999, 1_500_000_000, 2**32 - 2], dtype=np.uint32)
    got = np.asarray(interleave(jnp.asarray(r), jnp.full(6, quota, U32), jnp.full(6, items, U32))).tolist()
    # Two passes: the first holds the even quantiles j = 0, 2, ... (2^31 of them), the second the odd.
    first = (quota + 1) // 2
    want = [2 * x if x < first else 2 * (x - first) + 1 for x in r.tolist()]
    assert got == want


def test_search_last_finds_the_block():
    cum = jnp.asarray([0, 0, 3, 3, 3, 10, 11], dtype=U32)  # empty blocks are skipped
    rows = jnp.arange(11, dtype=U32)
    got = search_last(lambda d: cum[d], rows, 6, steps=3)
    assert np.asarray(got).tolist() == [1, 1, 1, 4, 4, 4, 4, 4, 4, 4, 5]
