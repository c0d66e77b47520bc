"""Era and block shuffles: Levanter/marin identity, bijections, locality, epochs, errors.

Compiles dominate this file (a Levanter-compat key schedule is a large program), so the tests
share a few fixed shapes through the module-level jits ``_apply``/``_apply_epoch``: whole orders
are taken over ``FIXED`` lanes (lanes past the length come back ``INVALID`` and are dropped).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import levanter_era_order, marin_block_order
from test_permutation import BIJECTION_LENGTHS, _apply, assert_bijection

import meshbatch
from meshbatch.kernels.shuffles import era_block

U32 = jnp.uint32
ERA_CASES = [
    (1, 1),
    (10, 4),
    (7, 7),
    (7, 100),
    (100, 8),
    (1003, 17),
    (5000, 1024),
    (4097, 4096),
    (8192, 1000),
]
BLOCK_CASES = [
    (1, 1, 1),
    (10, 3, 2),
    (12, 3, 2),  # no tail
    (7, 10, 2),  # only a tail
    (100, 7, 3),
    (257, 16, 1),  # one block per window
    (1025, 128, 8),  # one window, tail of 1
    (3000, 64, 8),  # several windows, tail in the last
    (8192, 128, 8),  # the quality benchmark's layout
]


def _whole(shuffle, length: int, epoch=None) -> np.ndarray:
    """``shuffle`` over ``[0, length)`` through one fixed-shape compiled call (padding lanes unused);
    ``epoch`` a scalar or one per lane of ``FIXED``."""
    assert length <= FIXED
    if epoch is None:
        return np.asarray(_apply(shuffle, LANES))[:length]
    return np.asarray(_apply_epoch(shuffle, LANES, epoch))[:length]


FIXED = 1 << 14
LANES = jnp.arange(FIXED, dtype=U32)


@pytest.mark.parametrize("kind", ["feistel", "linear"])
@pytest.mark.parametrize(("length", "era_length"), ERA_CASES)
def test_era_shuffle_equals_levanter(kind, length, era_length):
    key = jax.random.PRNGKey(length)
    shuffle = meshbatch.era_shuffle(length, era_length=era_length, key=key, kind=kind, compat="levanter")
    ours = _whole(shuffle, length)
    np.testing.assert_array_equal(ours, levanter_era_order(length, era_length, key, kind))


@pytest.mark.parametrize("kind", ["feistel", "linear"])
@pytest.mark.parametrize(("length", "io_block_size", "window_blocks"), BLOCK_CASES)
def test_block_shuffle_equals_marin(kind, length, io_block_size, window_blocks):
    key = jax.random.PRNGKey(7)
    shuffle = meshbatch.block_shuffle(
        length,
        io_block_size=io_block_size,
        window_blocks=window_blocks,
        key=key,
        kind=kind,
        compat="levanter",
    )
    ours = _whole(shuffle, length)
    np.testing.assert_array_equal(ours, marin_block_order(length, io_block_size, window_blocks, key, kind))


@pytest.mark.parametrize("compat", [None, "levanter"])
@pytest.mark.parametrize("kind", ["feistel", "linear"])
def test_era_shuffle_is_a_bijection(kind, compat):
    for length in BIJECTION_LENGTHS:
        era_length = max(1, length // 5 + 3)
        shuffle = meshbatch.era_shuffle(
            length, era_length=era_length, key=jax.random.key(length), kind=kind, compat=compat
        )
        assert_bijection(shuffle, length)


@pytest.mark.parametrize("compat", [None, "levanter"])
@pytest.mark.parametrize("kind", ["feistel", "linear"])
def test_block_shuffle_is_a_bijection(kind, compat):
    for length in BIJECTION_LENGTHS:
        io = max(1, int(np.sqrt(length)) // 2 + 1)
        shuffle = meshbatch.block_shuffle(
            length, io_block_size=io, window_blocks=3, key=jax.random.key(length), kind=kind, compat=compat
        )
        assert_bijection(shuffle, length)


@pytest.mark.parametrize("compat", [None, "levanter"])
def test_era_shuffle_stays_inside_its_era(compat):
    length, era = 10_000, 512
    shuffle = meshbatch.era_shuffle(length, era_length=era, key=jax.random.key(0), compat=compat)
    x = np.arange(length)
    out = _whole(shuffle, length)
    np.testing.assert_array_equal(out // era, x // era)


@pytest.mark.parametrize("compat", [None, "levanter"])
def test_block_shuffle_windows_read_whole_blocks_and_keep_the_tail_last(compat):
    length, io, wb = 3000, 64, 8
    shuffle = meshbatch.block_shuffle(
        length, io_block_size=io, window_blocks=wb, key=jax.random.key(1), compat=compat
    )
    out = _whole(shuffle, length)
    full_blocks, tail = divmod(length, io)
    window = io * wb
    for start in range(0, full_blocks * io - window + 1, window):
        blocks = np.unique(out[start : start + window] // io)
        assert blocks.size == wb, f"window at {start} touches {blocks.size} blocks"
    np.testing.assert_array_equal(np.sort(out[-tail:]), np.arange(full_blocks * io, length))


@pytest.mark.parametrize("compat", [None, "levanter"])
@pytest.mark.parametrize("which", ["era", "block"])
def test_epoch_reshuffle(which, compat):
    key = jax.random.PRNGKey(11)

    def make(k):
        if which == "era":
            return meshbatch.era_shuffle(2000, era_length=300, key=k, compat=compat)
        return meshbatch.block_shuffle(2000, io_block_size=32, window_blocks=4, key=k, compat=compat)

    shuffle = make(key)
    plain = _whole(shuffle, 2000, epoch=0)
    np.testing.assert_array_equal(plain, _whole(shuffle, 2000))
    epoch2 = _whole(shuffle, 2000, epoch=2)
    np.testing.assert_array_equal(epoch2, _whole(make(jax.random.fold_in(key, 2)), 2000))
    per_lane = jnp.where(LANES < 1000, 0, 2).astype(U32)
    np.testing.assert_array_equal(
        _whole(shuffle, 2000, epoch=per_lane), np.where(np.arange(2000) < 1000, plain, epoch2)
    )


@jax.jit
def _apply_epoch(shuffle, indices, epoch):
    return shuffle(indices, epoch=epoch)


@pytest.mark.parametrize("compat", [None, "levanter"])
def test_batch_table_path_equals_per_index_path(compat):
    """A batch inside a few eras/windows derives each key schedule once; values must not change."""
    era = meshbatch.era_shuffle(50_000, era_length=1000, key=jax.random.key(2), compat=compat)
    block = meshbatch.block_shuffle(
        50_000, io_block_size=100, window_blocks=5, key=jax.random.key(3), compat=compat
    )
    few = jnp.arange(4096, dtype=U32) + U32(7000)  # 5 eras, 9 window regions: the table path
    assert (4096 + 999) // 1000 + 1 <= era_block.MAX_TABLE_GROUPS
    spread = few.at[-1].set(49_999)  # one far index: too many groups, every lane derives its own
    for shuffle in (era, block):
        np.testing.assert_array_equal(
            np.asarray(_apply(shuffle, few))[:-1], np.asarray(_apply(shuffle, spread))[:-1]
        )


def test_no_retrace_across_keys_and_lengths():
    @jax.jit
    @chex.assert_max_traces(n=2)  # one trace per shuffle type
    def shuffled(shuffle, indices):
        return shuffle(indices)

    x = jnp.arange(2048, dtype=U32)
    for length, seed in [(10_000, 0), (10_000, 1), (77_777, 2)]:
        shuffled(meshbatch.era_shuffle(length, era_length=1000, key=jax.random.key(seed)), x)
        shuffled(
            meshbatch.block_shuffle(length, io_block_size=64, window_blocks=8, key=jax.random.key(seed)), x
        )


def test_sharded_indices_give_identical_results():
    """Each device shuffles its own shard of indices (shard_map, as the pipeline runs it)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    spec = jax.sharding.PartitionSpec("data")
    x = jnp.arange(1 << 14, dtype=U32)

    @jax.jit
    def per_shard(shuffle, indices):
        return jax.shard_map(lambda i: shuffle(i), mesh=mesh, in_specs=spec, out_specs=spec)(indices)

    for compat in (None, "levanter"):
        for shuffle in (
            meshbatch.era_shuffle(20_000, era_length=700, key=jax.random.key(4), compat=compat),
            meshbatch.block_shuffle(
                20_000, io_block_size=64, window_blocks=8, key=jax.random.key(4), compat=compat
            ),
        ):
            out = per_shard(shuffle, x)
            assert len(out.sharding.device_set) == 8
            np.testing.assert_array_equal(np.asarray(out), np.asarray(_apply(shuffle, x)))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(era_length=0), ValueError, r"era_length must be >= 1 \(got era_length=0\)"),
        (dict(era_length=2.0), TypeError, "era_length=2.0"),
    ],
)
def test_bad_era_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        meshbatch.era_shuffle(100, key=jax.random.key(0), **kwargs)


@pytest.mark.parametrize(
    ("length", "kwargs", "match"),
    [
        (100, dict(io_block_size=0, window_blocks=8), "io_block_size=0"),
        (100, dict(io_block_size=8, window_blocks=-1), "window_blocks=-1"),
        (2**32 - 1, dict(io_block_size=2**20, window_blocks=8), "exceeds 2\\*\\*32 - 1"),
        (0, dict(io_block_size=8, window_blocks=8), "length=0"),
    ],
)
def test_bad_block_arguments(length, kwargs, match):
    with pytest.raises(ValueError, match=match):
        meshbatch.block_shuffle(length, key=jax.random.key(0), **kwargs)


def test_out_of_range_indices_raise():
    shuffle = meshbatch.block_shuffle(100, io_block_size=8, window_blocks=2, key=jax.random.key(0))
    with pytest.raises(IndexError, match="index 100 is out of range for length=100"):
        shuffle(np.array([5, 100]))
    with pytest.raises(IndexError, match="index -2 is out of range"):
        meshbatch.era_shuffle(100, era_length=10, key=jax.random.key(0))(np.array([-2]))


def test_epoch_edge_cases_from_review():
    """Python-int epochs never retrace; empty inputs, 2-D epochs and large Python ints work."""
    era = meshbatch.era_shuffle(1000, era_length=100, key=jax.random.key(0))
    x = jnp.arange(12, dtype=U32).reshape(4, 3)
    chex.assert_trees_all_equal(era(x, epoch=2), era(x, epoch=np.uint32(2)))
    traces = []
    probe = jax.jit(lambda s, i, e: (traces.append(1), s(i, epoch=e))[1])
    for e in range(4):
        probe(era, x, e)
    assert len(traces) == 1
    per_row = jnp.asarray([[0], [1], [0], [2]], U32)  # broadcasts against [4, 3]
    for shuffle in (era, meshbatch.permutation("feistel", 1000, jax.random.key(0))):
        got = np.asarray(shuffle(x, epoch=per_row))
        for r, e in enumerate([0, 1, 0, 2]):
            np.testing.assert_array_equal(got[r], np.asarray(shuffle(x[r], epoch=e)))
        assert shuffle(jnp.zeros((0,), U32), epoch=jnp.zeros((0,), U32)).shape == (0,)
    big = meshbatch.permutation("feistel", 2**32 - 1, jax.random.key(1))
    assert int(big([3_000_000_000])[0]) < 2**32 - 1
    with pytest.raises(ValueError, match=r"threefry2x32 key.*impl='rbg'"):
        meshbatch.era_shuffle(1000, era_length=100, key=jax.random.key(0, impl="rbg"))


def test_one_invalid_lane_keeps_the_table_path_values():
    era = meshbatch.era_shuffle(50_000, era_length=1000, key=jax.random.key(2))
    few = jnp.arange(4096, dtype=U32) + U32(7000)
    with_invalid = few.at[-1].set(U32(2**32 - 1))
    got = np.asarray(_apply(era, with_invalid))
    np.testing.assert_array_equal(got[:-1], np.asarray(_apply(era, few))[:-1])
    assert got[-1] == 2**32 - 1


@pytest.mark.parametrize("which", ["full", "era", "block"])
def test_lanes_shuffle_each_lane_by_its_own_shuffle(which):
    """Alike shuffles of other lengths and keys stacked, then gathered per lane: each lane gets
    what its own shuffle gives its index (plain and in per-lane epochs), as a mixture's rows do.
    (Levanter's key schedules: tests/datasets/test_mixture_stacks.py, through the mixture.)"""
    compat = None
    lengths = [37, 1000, 64, 517]

    def make(length, k):
        key = jax.random.key(k)
        if which == "full":
            return meshbatch.permutation("feistel", length, key, compat=compat)
        if which == "era":
            return meshbatch.era_shuffle(length, era_length=30, key=key, compat=compat)
        return meshbatch.block_shuffle(length, io_block_size=8, window_blocks=3, key=key, compat=compat)

    shuffles = [make(length, 5 + k) for k, length in enumerate(lengths)]
    stack = jax.tree.map(lambda *leaves: jnp.stack(leaves), *shuffles)
    rng = np.random.default_rng(0)
    member = rng.integers(0, len(lengths), 300)
    index = (rng.random(300) * np.asarray(lengths)[member]).astype(np.uint32)
    epoch = rng.integers(0, 4, 300).astype(np.uint32)
    index, epoch = jnp.asarray(index), jnp.asarray(epoch)
    for tabled in (stack, stack.with_orders()):  # short orders walked, then read from tables
        lanes = jax.tree.map(lambda leaf: leaf[member], tabled)
        for per_lane_epoch in (None, epoch):
            got = np.asarray(_lanes(lanes, index, per_lane_epoch))
            for m, one in enumerate(shuffles):  # every lane through each (one shape: one compile)
                want = _apply(one, index) if per_lane_epoch is None else _apply_epoch(one, index, epoch)
                mine = member == m
                np.testing.assert_array_equal(got[mine], np.asarray(want)[mine], err_msg=f"member {m}")


@jax.jit
def _lanes(shuffles, indices, epoch):
    return shuffles.lanes(indices, epoch)


@pytest.mark.parametrize("compat", [None, "levanter"])
@pytest.mark.parametrize("kind", ["feistel", "linear"])
def test_short_orders_read_from_their_table_equal_the_walk(kind, compat):
    """``with_orders`` keeps a permutation of at most ``SMALL`` indices, and a block shuffle's
    order of at most ``SMALL`` full blocks, as a table its plain key then reads; without it the
    order is derived and walked. Both give the same order at every length, across the table's
    edge."""
    small = meshbatch.kernels.shuffles.permutation.SMALL

    def check(shuffle, length, what):
        tabled = shuffle.with_orders()
        assert jax.tree.structure(tabled) != jax.tree.structure(shuffle)  # a table was made
        np.testing.assert_array_equal(_whole(tabled, length), _whole(shuffle, length), what)

    for length in [*range(1, 8), small - 1, small, small + 1, 3 * small]:
        perm = meshbatch.permutation(kind, length, jax.random.key(length), compat=compat)
        check(perm, length, f"{length}")
    for blocks in [0, 1, 2, 5, small - 1, small, small + 1]:
        for tail in (0, 3):
            length = blocks * 4 + tail
            if length == 0:
                continue
            block = meshbatch.block_shuffle(
                length, io_block_size=4, window_blocks=3, key=jax.random.key(blocks), kind=kind, compat=compat
            )
            check(block, length, f"{blocks} blocks, tail {tail}")
