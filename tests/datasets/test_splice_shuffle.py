"""Seeded per-epoch shuffles of splice schedules (rows, the t axis, the s axis).

Every shuffle is built on ``meshbatch.permutation`` (the Feistel permutation kernels); so is the
``random`` selection policy, tested in ``test_select.py``.
"""

from __future__ import annotations

from collections import Counter

import jax
import numpy as np
import pytest
from splice_reference import ref_frame

import meshbatch

LENGTHS = [1, 3, 9, 14, 30]
ENUMERATED = dict(seq_len=8, content_length=4, content_start_mode="slide_within")


def rows_of(schedule, epoch=0):
    doc, t, s, copy_len = schedule.lookup(np.arange(len(schedule), dtype=np.uint32), epoch)
    return list(zip(*(np.asarray(x).tolist() for x in (doc, t, s, copy_len)), strict=True))


@pytest.mark.parametrize(
    "spec",
    [
        ENUMERATED,
        dict(seq_len=8, content_length=5, content_start_mode="cyclic_roll", content_stride=2),
        dict(seq_len=8, content_start_mode="coverage_balanced", balance_mode="by_document"),
    ],
)
def test_shuffle_per_epoch_is_a_fresh_bijection_each_epoch(spec):
    plain = rows_of(meshbatch.splice_schedule(LENGTHS, **spec))
    shuffled = meshbatch.splice_schedule(LENGTHS, shuffle_per_epoch=True, key=jax.random.key(0), **spec)
    orders = [rows_of(shuffled, epoch) for epoch in range(3)]
    for order in orders:
        assert Counter(order) == Counter(plain)  # every pair exactly once per epoch
        assert order != plain
    assert orders[0] != orders[1] != orders[2]
    again = meshbatch.splice_schedule(LENGTHS, shuffle_per_epoch=True, key=jax.random.key(0), **spec)
    assert rows_of(again, 1) == orders[1]


def test_shuffle_offsets_keeps_t_major_order_and_permutes_each_block():
    plain = rows_of(meshbatch.splice_schedule(LENGTHS, **ENUMERATED))
    schedule = meshbatch.splice_schedule(LENGTHS, shuffle_offsets=True, key=jax.random.key(1), **ENUMERATED)
    for epoch in range(2):
        got = rows_of(schedule, epoch)
        assert [r[:2] for r in got] == [r[:2] for r in plain]  # same (doc, t) sequence
        assert Counter(got) == Counter(plain)
        assert got != plain
    assert rows_of(schedule, 0) != rows_of(schedule, 1)


def test_shuffle_offsets_window_permutes_inside_each_window():
    """``shuffle_offsets: 3`` (an int, Levanter's era length): placement ``i`` of a start stays in
    its window ``i // 3``; every window of every start still permuted, fresh per epoch."""
    plain = rows_of(meshbatch.splice_schedule(LENGTHS, **ENUMERATED))
    schedule = meshbatch.splice_schedule(LENGTHS, shuffle_offsets=3, key=jax.random.key(1), **ENUMERATED)
    orders = [rows_of(schedule, epoch) for epoch in range(2)]
    for got in orders:
        assert [r[:2] for r in got] == [r[:2] for r in plain]
        assert Counter(got) == Counter(plain)
        assert [r[2] // 3 for r in got] == [r[2] // 3 for r in plain]  # s = i (offset_stride 1)
        assert got != plain
    assert orders[0] != orders[1]
    whole = rows_of(
        meshbatch.splice_schedule(LENGTHS, shuffle_offsets=True, key=jax.random.key(1), **ENUMERATED)
    )
    assert [r[2] // 3 for r in whole] != [r[2] // 3 for r in plain]  # the whole-axis shuffle crosses windows


def test_shuffle_content_window_keeps_starts_in_their_window():
    """``shuffle_content: 2`` on a uniform layout (cyclic_roll, one count per start): round by round,
    the ``r``-th row of a round reads a start of window ``r // 2``, permuted inside it."""
    spec = dict(seq_len=8, content_length=5, content_start_mode="cyclic_roll")
    plain = rows_of(meshbatch.splice_schedule(LENGTHS, **spec))
    windowed = rows_of(meshbatch.splice_schedule(LENGTHS, shuffle_content=2, key=jax.random.key(2), **spec))
    assert Counter(windowed) == Counter(plain)
    moved = False
    for doc in sorted({r[0] for r in plain}):
        starts = [r[1] for r in windowed if r[0] == doc]
        slots = len({r[1] for r in plain if r[0] == doc})
        assert [t // 2 for t in starts] == [(p % slots) // 2 for p in range(len(starts))]
        moved |= starts != [p % slots for p in range(len(starts))]
    assert moved


def test_axis_seeds_fix_an_axis_across_pipeline_keys():
    """``offset_seed``/``content_seed``: that axis's order is the seed's, whatever the schedule's
    key; the axes without a seed (and the row shuffle) still follow the key."""
    spec = dict(ENUMERATED, shuffle_offsets=True, offset_seed=7, shuffle_content=True)
    a = meshbatch.splice_schedule(LENGTHS, key=jax.random.key(0), **spec)
    b = meshbatch.splice_schedule(LENGTHS, key=jax.random.key(1), **spec)
    assert rows_of(a) != rows_of(b)  # the content axis follows the key
    only_offsets = dict(ENUMERATED, shuffle_offsets=True, offset_seed=7)
    seeded = [rows_of(meshbatch.splice_schedule(LENGTHS, key=k, **only_offsets)) for k in (0, 1, None)]
    assert seeded[0] == seeded[1] == seeded[2]  # no key needed: the only shuffle has its seed
    by_key = [
        rows_of(meshbatch.splice_schedule(LENGTHS, key=k, shuffle_offsets=True, **ENUMERATED)) for k in (7, 8)
    ]
    assert by_key[0] != by_key[1]
    assert seeded[0] != rows_of(meshbatch.splice_schedule(LENGTHS, **dict(only_offsets, offset_seed=8)))


@pytest.mark.parametrize(
    "fields, error, match",
    [
        (dict(offset_seed=3), ValueError, "offset_seed=3 only applies when shuffle_offsets is set"),
        (dict(content_seed=3), ValueError, "content_seed=3 only applies when shuffle_content is set"),
        (dict(shuffle_offsets=1), ValueError, "shuffle_offsets"),
        (dict(shuffle_offsets=0), ValueError, "shuffle_offsets"),
        (dict(shuffle_content="yes"), TypeError, "shuffle_content='yes'"),
        (dict(shuffle_offsets=True, offset_seed=-1), ValueError, "offset_seed"),
        (dict(shuffle_offsets=True, offset_seed=2.0), TypeError, "offset_seed"),
    ],
)
def test_axis_shuffle_fields_are_checked_by_name(fields, error, match):
    with pytest.raises(error, match=match):
        meshbatch.splice_schedule(LENGTHS, key=jax.random.key(0), **ENUMERATED, **fields)


@pytest.mark.parametrize(
    "spec",
    [
        ENUMERATED,
        dict(seq_len=8, content_length=5, content_start_mode="cyclic_roll"),
        dict(seq_len=4, mode="slide"),
    ],
)
def test_shuffle_content_visits_starts_round_by_round(spec):
    plain = rows_of(meshbatch.splice_schedule(LENGTHS, **spec))
    schedule = meshbatch.splice_schedule(LENGTHS, shuffle_content=True, key=jax.random.key(2), **spec)
    got = rows_of(schedule, 0)
    assert Counter(got) == Counter(plain)
    assert [r[0] for r in got] == [r[0] for r in plain]  # documents stay in blocks
    for doc in set(r[0] for r in plain):
        block = [r for r in got if r[0] == doc]
        placements = {}
        for t, s in ((r[1], r[2]) for r in plain if r[0] == doc):
            placements.setdefault(t, []).append(s)
        # Round i holds the i-th placement of every start that has one, in a shuffled start order.
        rounds = {}
        for t, s in ((r[1], r[2]) for r in block):
            rounds.setdefault(placements[t].index(s), []).append(t)
        for i, starts in rounds.items():
            assert sorted(starts) == sorted(t for t, ss in placements.items() if len(ss) > i)
        assert [i for i in (placements[r[1]].index(r[2]) for r in block)] == sorted(
            placements[r[1]].index(r[2]) for r in block
        )
    assert got != rows_of(schedule, 1)


def test_both_axis_shuffles_together_are_a_bijection():
    plain = rows_of(meshbatch.splice_schedule(LENGTHS, **ENUMERATED))
    schedule = meshbatch.splice_schedule(
        LENGTHS,
        shuffle_content=True,
        shuffle_offsets=True,
        shuffle_per_epoch=True,
        key=jax.random.key(3),
        **ENUMERATED,
    )
    for epoch in range(3):
        assert Counter(rows_of(schedule, epoch)) == Counter(plain)


def test_sharded_processes_cover_an_epoch_once():
    schedule = meshbatch.splice_schedule(LENGTHS, shuffle_per_epoch=True, key=jax.random.key(4), **ENUMERATED)
    n = len(schedule)
    seen = []
    for process in range(3):
        local = np.arange(-(-n // 3))
        owned = meshbatch.shard_indices(local, process_index=process, process_count=3)
        owned = owned[owned < n].astype(np.uint32)
        doc, t, s, _ = schedule.lookup(owned, 0)
        seen += list(zip(*(np.asarray(x).tolist() for x in (doc, t, s)), strict=True))
    assert Counter(seen) == Counter(r[:3] for r in rows_of(meshbatch.splice_schedule(LENGTHS, **ENUMERATED)))


def test_shuffled_batches_build_the_scheduled_frames():
    docs = [np.arange(L) + 100 * i for i, L in enumerate(LENGTHS)]
    data = meshbatch.SpliceDataset(
        docs,
        shuffle_per_epoch=True,
        shuffle_content=True,
        key=jax.random.key(5),
        pad_token_id=-1,
        **ENUMERATED,
    )
    indices = np.arange(len(data) - 3, len(data) + 9)  # straddles epochs 0 and 1
    tokens = np.asarray(data.get_batch(indices).tokens)
    for epoch in (0, 1):
        doc, t, s, copy_len = (np.asarray(x) for x in data.schedule.lookup(indices % len(data), epoch))
        for row in np.flatnonzero(indices // len(data) == epoch):
            want = ref_frame(docs[doc[row]], t[row], s[row], copy_len[row], S=8)[0]
            np.testing.assert_array_equal(tokens[row], want)


def test_validation_set_ignores_shuffles():
    docs = [np.arange(10), np.arange(3) + 50]
    spec = dict(seq_len=8, content_length=4, content_start_mode="slide_within", pad_token_id=-1)
    plain = meshbatch.splice_validation_set(docs, **spec)
    keyed = meshbatch.splice_validation_set(
        docs, shuffle_per_epoch=True, shuffle_content=True, key=jax.random.key(3), **spec
    )
    np.testing.assert_array_equal(np.asarray(keyed.tokens), np.asarray(plain.tokens))
