"""meshbatch.mixture_schedule: Levanter's MixtureDataset row for row, the default, stop strategies."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mixture_reference import levanter_rows, stable_rows

import meshbatch
from meshbatch.kernels.mixtures import stable_mixture

ROWS = 512  # every call pads to this many rows: one compiled lookup per mode for the whole file


def locate(schedule, rows, epoch=0):
    """``schedule.locate`` as Python tuples, through one fixed-size call per ``ROWS`` rows."""
    rows = np.asarray(rows, np.int64)
    out = []
    for start in range(0, len(rows), ROWS):
        chunk = rows[start : start + ROWS]
        padded = np.concatenate([chunk, np.zeros(ROWS - len(chunk), np.int64)])
        got = schedule.locate(jnp.asarray(padded.astype(np.uint32)), epoch)
        out += list(zip(*(np.asarray(x)[: len(chunk)].tolist() for x in got), strict=True))
    return out


def random_config(rng, *, staged: bool):
    sources = int(rng.integers(2, 7))
    names = [f"s{i}" for i in range(sources)]
    lengths = {n: int(rng.integers(3, 400)) for n in names}
    short = names[int(rng.integers(1, sources))]
    lengths[short] = int(rng.integers(1, 6))  # wraps early
    block_size = int(rng.choice([16, 33]))  # Levanter sorts blocks: one compile per size

    def weights():
        return {n: float(rng.choice([0.0, 0.1, 0.25, 1.0, 3.0])) or 0.5 for n in names}

    first = {**weights(), short: 3.0}
    if not staged:
        return lengths, first, block_size
    stages, start = [(0, first)], 0
    for _ in range(int(rng.integers(1, 3))):
        start += block_size * int(rng.integers(1, 4))
        stage = weights()
        stage[names[0]] = 0.0  # a source switched off for a stage
        stages.append((start, stage))
    return lengths, stages, block_size


@pytest.mark.parametrize("seed", range(6))
def test_levanter_rows_equal_mixture_dataset(seed):
    """Must-show 1: compat="levanter" equals Levanter's MixtureDataset.get_batch item for item,
    over several blocks and past the short source's wrap-around (restart: the only strategy
    Levanter implements)."""
    rng = np.random.default_rng(seed)
    lengths, weights, block_size = random_config(rng, staged=seed % 2 == 1)
    blocks = max(4, -(-3 * min(lengths.values()) // block_size))
    # consecutive rows, then scattered far ones: many distinct blocks in one call (several rounds
    # of the per-block permutation table)
    rows = np.concatenate([np.arange(0, blocks * block_size + 5), rng.integers(0, 2**20, 50)])
    schedule = meshbatch.mixture_schedule(
        lengths, weights, block_size=block_size, key=seed, compat="levanter"
    )
    got = locate(schedule, rows)
    assert [(s, i) for s, i, _ in got] == levanter_rows(lengths, weights, block_size, seed, rows)
    short = list(lengths).index(min(lengths, key=lengths.get))
    assert max(e for s, _, e in got if s == short) >= 1  # the short source did wrap


@pytest.mark.parametrize(
    ("compat", "block_size"),
    [(None, b) for b in (3, 4, 16, 17, 255, 256, 257, 1000)] + [("levanter", b) for b in (1, 16)],
)
def test_rows_equal_reference_at_awkward_block_sizes(compat, block_size):
    lengths = {"a": 40, "b": 7, "c": 1000}
    stages = [(0, {"a": 1.0, "b": 1.0, "c": 2.0}), (3 * block_size, {"a": 0.0, "b": 1.0, "c": 3.0})]
    key = jax.random.key(11)
    schedule = meshbatch.mixture_schedule(lengths, stages, block_size=block_size, key=key, compat=compat)
    rows = np.arange(0, 6 * block_size + 3)
    got = locate(schedule, rows)
    assert got == stable_rows(lengths, stages, block_size, key, rows, compat)
    source = np.array([s for s, _, _ in got])
    counts = np.asarray(schedule.counts)[:2, :3]  # the tables are padded
    for b in range(6):  # every whole block holds its stage's counts exactly
        stage = 0 if b < 3 else 1
        here = source[b * block_size : (b + 1) * block_size]
        assert np.bincount(here, minlength=3).tolist() == counts[stage].tolist()
    assert counts.sum(axis=1).tolist() == [block_size, block_size]
    # Levanter gives a whole 1-row block to source 0 although its stage weight is 0 (every share
    # truncates to 0, and the remainder goes to the argmax of zeros); the default never does.
    assert counts[1, 0] == (1 if (compat, block_size) == ("levanter", 1) else 0)


def test_default_refuses_a_block_too_small_for_every_source():
    with pytest.raises(ValueError, match=r"'b' .* gets 0 of block_size=2 rows"):
        meshbatch.mixture_schedule(
            {"a": 4, "b": 4, "c": 4}, {"a": 1.0, "b": 1.0, "c": 2.0}, block_size=2, key=0
        )


def test_huge_rows_and_epochs_equal_python_integers():
    """Read numbers past 2**32 never form on device: the divmods stay exact."""
    lengths = {"a": 3, "b": 2**31 + 5, "c": 65537}
    weights = {"a": 1.0, "b": 5.0, "c": 2.0}
    schedule = meshbatch.mixture_schedule(lengths, weights, block_size=4000, key=5)
    per_pass = int(schedule.num_rows)
    rows = np.array([0, 1, 3999, 4000, 2**31, 2**32 - 4000 * 3, per_pass - 1], np.int64)
    for epoch in (0, 1, 3):
        want = stable_rows(lengths, weights, 4000, jax.random.key(5), rows + epoch * per_pass)
        assert locate(schedule, rows, epoch) == want


def test_default_is_pinned():
    # Golden: default-mode mixtures in checkpoints and docs/mixtures.md rely on this order.
    weights = {"a": 0.5, "b": 0.2, "c": 0.3}
    schedule = meshbatch.mixture_schedule({"a": 10, "b": 4, "c": 6}, weights, block_size=5, key=0)
    located = locate(schedule, range(10))
    assert [s for s, _, _ in located] == GOLDEN_SOURCE
    assert [i for _, i, _ in located] == GOLDEN_INDEX


GOLDEN_SOURCE = [0, 0, 2, 1, 0, 0, 1, 0, 2, 0]
GOLDEN_INDEX = [0, 2, 0, 0, 1, 5, 1, 3, 1, 4]


@pytest.mark.parametrize("compat", [None, "levanter"])
def test_finite_strategies_equal_sequential_reference(compat):
    lengths = {"a": 23, "b": 9, "c": 60}
    sizes = list(lengths.values())
    stages = [(0, {"a": 1.0, "b": 1.0, "c": 1.0}), (32, {"a": 2.0, "b": 0.0, "c": 1.0})]
    key = jax.random.key(3)
    every = stable_rows(lengths, stages, 16, key, range(400), compat)
    reads = [(s, i + w * sizes[s]) for s, i, w in every]  # (source, read number) per row

    def make(strategy):
        return meshbatch.mixture_schedule(
            lengths, stages, block_size=16, key=key, stop_strategy=strategy, compat=compat
        )

    # first_exhausted: the whole blocks before the first one holding a read past a source's end
    first = make("first_exhausted")
    overrun = min(r for r, (s, read) in enumerate(reads) if read >= sizes[s])
    first_end = overrun // 16 * 16
    assert int(first.num_rows) == first_end > 0
    assert locate(first, range(first_end)) == every[:first_end]
    with pytest.raises(IndexError, match="out of range"):
        first.lookup(np.array([first_end], np.uint32))
    # a replayed pass moves each source's epoch on by its wraps per pass (here 1: none wraps)
    assert locate(first, range(first_end), 1) == [(s, i, 1) for s, i, _ in every[:first_end]]

    # all_exhausted: the fewest whole blocks holding every item of every source; b has no rows
    # after row 32, but its 10 reads before then cover its 9 items
    last = [
        max(r for r, (t, read) in enumerate(reads) if t == s and read == n - 1) for s, n in enumerate(sizes)
    ]
    full = make("all_exhausted")
    assert int(full.num_rows) == (max(last) // 16 + 1) * 16
    got = locate(full, range(int(full.num_rows)))
    assert got == every[: int(full.num_rows)]
    assert {(s, i) for s, i, _ in got} == {(s, i) for s, n in enumerate(sizes) for i in range(n)}
    wraps = [max(w for t, _, w in got if t == s) + 1 for s in range(3)]
    assert np.asarray(full.passes)[:3].tolist() == wraps


def test_finite_lengths_worked_example():
    """The trace in meshbatch/datasets/mixtures/mixture_schedule.py's docstring."""
    lengths, weights = {"a": 5, "b": 9}, {"a": 1.0, "b": 1.0}

    def make(lengths, strategy):
        return meshbatch.mixture_schedule(lengths, weights, block_size=4, key=0, stop_strategy=strategy)

    first, full = make(lengths, "first_exhausted"), make(lengths, "all_exhausted")
    assert int(first.num_rows) == 8 and int(full.num_rows) == 20
    assert np.asarray(full.passes)[:2].tolist() == [2, 2]
    with pytest.raises(ValueError, match=r"'a' \(1 rows\) runs out inside the first block"):
        make({"a": 1, "b": 9}, "first_exhausted")


def test_all_exhausted_refuses_a_source_that_never_finishes():
    stages = [(0, {"a": 1.0, "b": 1.0}), (4, {"a": 1.0, "b": 0.0})]
    with pytest.raises(ValueError, match="'b' gets no rows in the last stage"):
        meshbatch.mixture_schedule(
            {"a": 5, "b": 50}, stages, block_size=4, key=0, stop_strategy="all_exhausted"
        )


def test_lookup_never_recompiles():
    schedule = meshbatch.mixture_schedule({"a": 5, "b": 50}, {"a": 1.0, "b": 2.0}, block_size=8, key=0)
    schedule.lookup(jnp.arange(ROWS, dtype=jnp.uint32))
    before = stable_mixture._locate._cache_size()
    for start in (ROWS, 10**6, 2**31):
        schedule.lookup(jnp.arange(start, start + ROWS, dtype=jnp.uint32), epoch=start % 3)
    # another mixture (up to 8 sources and 4 stages share the padded tables), block size and key
    other = meshbatch.mixture_schedule(
        {"a": 7, "b": 9, "c": 3}, {"a": 3.0, "b": 2.0, "c": 1.0}, block_size=13, key=1
    )
    other.lookup(jnp.arange(ROWS, dtype=jnp.uint32))
    assert stable_mixture._locate._cache_size() == before
    chex.assert_type(schedule.lookup(jnp.arange(4, dtype=jnp.uint32)), (jnp.int32, jnp.uint32))


A5 = {"a": 5}
AB = {"a": 5, "b": 5}


@pytest.mark.parametrize(
    ("lengths", "weights", "kwargs", "error", "match"),
    [
        (AB, {"a": 1.0, "b": 0.0}, {}, ValueError, "weight of 'b' is 0"),
        (AB, {"a": 1.0, "b": -1.0}, {}, ValueError, "weight of 'b' must be >= 0.0"),
        (AB, [(0, {"a": 0.0, "b": 0.0})], {}, ValueError, "weights sum to 0"),
        (AB, {"a": 1.0, "b": 1.0, "c": 1.0}, {}, ValueError, r"unknown source\(s\) \['c'\]"),
        (AB, {"a": 1.0}, {}, ValueError, r"no weight for source\(s\) \['b'\]"),
        (AB, {"a": 1.0, "b": "x"}, {}, TypeError, "weight of 'b' must be a number"),
        ({"a": 5, "b": 0}, {"a": 1.0, "b": 1.0}, {}, ValueError, r"lengths\['b'\] must be >= 1"),
        (A5, {"a": 1.0}, {"block_size": 0}, ValueError, "block_size must be >= 1"),
        (
            A5,
            {"a": 1.0},
            {"block_size": 2**16, "compat": "levanter"},
            ValueError,
            "block_size must be <= 65535",
        ),
        (A5, {"a": 1.0}, {"block_size": True}, TypeError, "block_size must be an int"),
        (A5, {"a": 1.0}, {"stop_strategy": "stop"}, ValueError, "stop_strategy='stop' is not one of"),
        (A5, {"a": 1.0}, {"compat": "marin"}, ValueError, "compat='marin' is not one of"),
        (A5, [(4, {"a": 1.0})], {}, ValueError, "first stage must start at row 0"),
        (A5, [(0, {"a": 1.0}), (6, {"a": 1.0})], {}, ValueError, "row 6, not a multiple of block_size=4"),
        (A5, [(0, {"a": 1.0}), (8, {"a": 1.0}), (8, {"a": 1.0})], {}, ValueError, "increase strictly"),
        (
            AB,
            [(0, {"a": 1.0, "b": 0.0}), (8, {"a": 1.0, "b": 0.0})],
            {},
            ValueError,
            "'b' has weight 0 in every",
        ),
        (AB, {"a": 1.0, "b": 0.01}, {}, ValueError, "'b' .* gets 0 of block_size=4 rows"),
        ({}, {"a": 1.0}, {}, ValueError, "lengths must be a non-empty dict"),
    ],
)
def test_errors_name_the_value(lengths, weights, kwargs, error, match):
    kwargs = {"block_size": 4, "key": 0, **kwargs}
    with pytest.raises(error, match=match):
        meshbatch.mixture_schedule(lengths, weights, **kwargs)


def test_levanter_counts_only_warn_where_the_default_fixes_them(caplog):
    """Levanter's truncation can starve a source (it only warns); the default's largest
    remainder gives it its row."""
    weights = {"a": 0.05, "b": 0.15, "c": 0.8}
    lengths = {"a": 100, "b": 100, "c": 100}
    lev = meshbatch.mixture_schedule(lengths, weights, block_size=10, key=0, compat="levanter")
    assert np.asarray(lev.counts)[:1, :3].tolist() == [[0, 1, 9]]
    assert "'a' has 0 rows per block" in caplog.text
    default = meshbatch.mixture_schedule(lengths, weights, block_size=10, key=0)
    assert np.asarray(default.counts)[:1, :3].tolist() == [[1, 1, 8]]
