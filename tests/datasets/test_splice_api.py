"""Host API: errors that name the bad value, epochs, sharding, validation grid, coverage, scale."""

from __future__ import annotations

import importlib

import jax
import jax.extend
import numpy as np
import pytest
from splice_reference import ref_pairs

import meshbatch
import meshbatch.datasets.splice as splice_module
import meshbatch.datasets.splice.indexed as splice_indexed
from meshbatch.kernels.splice.splice_rows import lookup_rows

P = -1


@pytest.mark.parametrize(
    ("lengths", "spec", "match"),
    [
        ([5], dict(seq_len=5, content_length=1), r"content_length must be >= 2 \(got content_length=1\)"),
        ([5], dict(seq_len=0), r"seq_len must be >= 1 \(got seq_len=0\)"),
        ([5], dict(seq_len=-3), r"seq_len must be >= 1 \(got seq_len=-3\)"),
        ([1, 1, 0], dict(seq_len=5), r"doc_lengths=\[1, 1, 0\] are all shorter than min_copy_len=2"),
        (
            [3, 5],
            dict(seq_len=8, min_copy_len=6, content_start_mode="slide_within"),
            "shorter than min_copy_len=6",
        ),
        ([3, 5], dict(seq_len=8, mode="slide"), r"shorter than seq_len=8 \(mode='slide'\)"),
        (
            [3, 5],
            dict(seq_len=8, content_length=6, content_start_mode="coverage_balanced", adaptive_k=False),
            r"shorter than content_length=6 \(adaptive_k=False\)",
        ),
        ([5], dict(seq_len=5, mode="splices"), "mode='splices' is not one of"),
        ([5], dict(seq_len=5, content_start_mode="random"), "content_start_mode='random' is not one of"),
        ([5], dict(seq_len=5, balance_mode="by_length"), "balance_mode='by_length' is not one of"),
        ([5], dict(seq_len=5, jitter_mode="sobol"), "jitter_mode='sobol' is not one of"),
        ([5], dict(seq_len=5, segment_mode="both"), "segment_mode='both' is not one of"),
        ([5], dict(seq_len=5, offset_stride=0), r"offset_stride must be >= 1 \(got offset_stride=0\)"),
        ([5], dict(seq_len=5, min_copy_len=1), r"min_copy_len must be >= 2 \(got min_copy_len=1\)"),
        ([5], dict(seq_len=5, content_length=3, min_copy_len=4), "content_length=3 < min_copy_len=4"),
        ([5], dict(seq_len=3, min_copy_len=4), "seq_len=3 < min_copy_len=4"),
        ([5], dict(seq_len=5, epoch_length=0), r"epoch_length must be >= 1 \(got epoch_length=0\)"),
        (
            [5],
            dict(seq_len=5, content_start_mode="coverage_balanced", alpha=-0.5),
            r"alpha must be >= 0.0 \(got alpha=-0.5\)",
        ),
        (
            [5],
            dict(seq_len=5, balance_tau=float("nan")),
            r"balance_tau must be finite \(got balance_tau=nan\)",
        ),
        ([5], dict(seq_len=5, alpha=0.8), "alpha=0.8 only applies to content_start_mode='coverage_balanced'"),
        ([5], dict(seq_len=5, offset_jitter=2), "offset_jitter=2 only applies to"),
        ([5], dict(seq_len=5, window_stride=2), "window_stride=2 only applies to mode='slide'"),
        ([5], dict(seq_len=5, content_stride=2), "content_stride=2 only applies to content_start_mode in"),
        (
            [5],
            dict(seq_len=5, mode="slide", content_length=3),
            "content_length=3 only applies to mode='splice'",
        ),
        (
            [5],
            dict(seq_len=5, content_start_mode="coverage_balanced", offset_stride=2),
            "offset_stride=2 only applies to enumerated splice modes",
        ),
        ([5], dict(seq_len=5, shuffle_per_epoch=True), "key=None"),
        (
            [2**30],
            dict(seq_len=4096, content_length=2, content_start_mode="slide_within"),
            "document 0 .* >= 2\\^32",
        ),
        (
            [2**19 + 1000, 2**19 + 1000],
            dict(seq_len=4096, content_length=2, content_start_mode="cyclic_roll"),
            "an epoch of 4302108720 rows",
        ),
        ([], dict(seq_len=5), "doc_lengths must be a non-empty 1-D array"),
        ([5, -1], dict(seq_len=5), "doc_lengths must lie in"),
    ],
)
def test_bad_input_names_the_value(lengths, spec, match):
    with pytest.raises(ValueError, match=match):
        meshbatch.splice_schedule(lengths, **spec)


def test_bad_types_and_names():
    with pytest.raises(TypeError, match="content_length must be an int"):
        meshbatch.splice_schedule([5], seq_len=5, content_length=2.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'k_window'"):
        meshbatch.splice_schedule([5], seq_len=5, k_window=2)
    with pytest.raises(ValueError, match="pad_token_id is required"):
        meshbatch.SpliceDataset([np.arange(5)], seq_len=5)
    data = meshbatch.SpliceDataset([np.arange(5)], seq_len=5, content_length=3, pad_token_id=P)
    with pytest.raises(ValueError, match="indices must be >= 0"):
        data.get_batch([0, -1])
    with pytest.raises(ValueError, match=r"t=\[5\] must lie in \[0, doc length \[5\]\)"):
        data.frames_at(0, 5, 0)
    with pytest.raises(ValueError, match=r"s=\[5\] must lie in \[0, 5\)"):
        data.frames_at(0, 0, 5)


def test_indices_past_an_epoch_wrap_into_the_next():
    data = meshbatch.SpliceDataset(
        [np.arange(9)], seq_len=6, content_length=3, content_start_mode="slide_within", pad_token_id=P
    )
    n = len(data)
    straddle = data.get_batch([n - 1, n, n + 1, 5 * n + 2])
    same = data.get_batch([n - 1, 0, 1, 2])
    jax.tree.map(np.testing.assert_array_equal, straddle, same)


def test_low_discrepancy_batch_across_an_epoch_boundary():
    data = meshbatch.SpliceDataset(
        [np.arange(40)], seq_len=16, content_length=8, content_start_mode="coverage_balanced",
        offset_jitter=3, jitter_mode="low_discrepancy", pad_token_id=P,
    )  # fmt: skip
    n = len(data)
    mixed = data.get_batch([n - 1, n])
    epoch0, epoch1 = data.get_batch([n - 1]), data.get_batch([n])
    np.testing.assert_array_equal(np.asarray(mixed.tokens), np.concatenate([epoch0.tokens, epoch1.tokens]))
    assert (
        np.asarray(epoch1.tokens).tolist() != np.asarray(data.get_batch([0]).tokens).tolist()
    )  # rotated jitter


def test_leapfrog_sharding_partitions_the_stream():
    owned = [meshbatch.shard_indices(np.arange(10), process_index=p, process_count=3) for p in range(3)]
    assert sorted(np.concatenate(owned).tolist()) == list(range(30))
    assert all((o % 3 == p).all() for p, o in enumerate(owned))
    with pytest.raises(ValueError, match="process_index=3 must be < process_count=3"):
        meshbatch.shard_indices([0], process_index=3, process_count=3)


def test_validation_grid_is_fixed_and_spread():
    docs = [np.arange(10), np.arange(3) + 50]
    spec = dict(seq_len=8, content_length=4, content_start_mode="slide_within", pad_token_id=P)
    schedule = meshbatch.SpliceDataset(docs, **spec).schedule
    rows = list(
        zip(*(x.tolist() for x in splice_module.validation_rows(schedule, starts=3, offsets=2)), strict=True)
    )
    # doc 0: starts t = 0..8 -> 0, 4, 8; t = 0, 4 place s in [0, 4] -> 0, 4;
    #        t = 8 copies 2 -> s in [0, 6] -> 0, 6.
    # doc 1: starts t = 0, 1 (t = 2 leaves one token): s in [0, 5] -> 0, 5; s in [0, 6] -> 0, 6.
    assert rows == [
        (0, 0, 0, 4), (0, 0, 4, 4), (0, 4, 0, 4), (0, 4, 4, 4), (0, 8, 0, 2), (0, 8, 6, 2),
        (1, 0, 0, 3), (1, 0, 5, 3), (1, 1, 0, 2), (1, 1, 6, 2),
    ]  # fmt: skip
    batch = meshbatch.splice_validation_set(docs, starts=3, offsets=2, **spec)
    assert np.asarray(batch.tokens)[4].tolist() == [8, 9, P, P, P, P, P, P]
    assert np.asarray(batch.doc_idx).tolist() == [0] * 6 + [1] * 4


@pytest.mark.parametrize("mode", ["slide_within", "cyclic_roll", "anchor_start"])
def test_coverage_counts_equal_reference(mode):
    L, S, K = 11, 6, 3
    schedule = meshbatch.splice_schedule([4, L], seq_len=S, content_length=K, content_start_mode=mode)
    want = np.zeros(L, dtype=np.int64)
    for t, _, copy_len in ref_pairs(L, S=S, K=K, start_mode=mode):
        want[(t + np.arange(copy_len)) % L] += 1
    np.testing.assert_array_equal(meshbatch.coverage_counts(schedule, 1, chunk=7), want)
    with pytest.raises(ValueError, match="doc=2 is out of range for num_docs=2"):
        meshbatch.coverage_counts(schedule, 2)


def test_coverage_counts_compile_once_for_documents_of_similar_rows():
    """Each call looks up a power-of-two bucket of rows (or ``chunk``): documents of 41, 37 and 33
    rows share one compiled lookup of 64 lanes, and the padding lanes change nothing."""
    # the module: the package re-exports a function of the same name
    schedules = importlib.import_module("meshbatch.datasets.splice.splice_schedule")

    L, S, K = 11, 6, 3
    schedule = meshbatch.splice_schedule(
        [L, L - 1, L - 2], seq_len=S, content_length=K, content_start_mode="slide_within"
    )
    assert meshbatch.pairs_per_doc(schedule).tolist() == [41, 37, 33]
    before = schedules._canonical._cache_size()
    counts = [meshbatch.coverage_counts(schedule, d) for d in range(3)]
    assert schedules._canonical._cache_size() - before <= 1  # 0 if an earlier test made the same one
    for d, length in enumerate([L, L - 1, L - 2]):
        want = np.zeros(length, dtype=np.int64)
        for t, _, copy_len in ref_pairs(length, S=S, K=K, start_mode="slide_within"):
            want[(t + np.arange(copy_len)) % length] += 1
        np.testing.assert_array_equal(counts[d], want)
        np.testing.assert_array_equal(meshbatch.coverage_counts(schedule, d, chunk=5), want)


def test_dataset_steps_never_retrace(monkeypatch):
    traces = []
    frames = splice_indexed.frames_of

    def counting(*args, **kwargs):  # runs only while jax traces the batch function
        traces.append(1)
        return frames(*args, **kwargs)

    monkeypatch.setattr(splice_indexed, "frames_of", counting)
    data = meshbatch.SpliceDataset(
        [np.arange(50), np.arange(20)],
        seq_len=16,
        content_length=8,
        content_start_mode="slide_within",
        pad_token_id=P,
    )
    for step in range(6):
        data.get_batch(np.arange(step * 13, step * 13 + 13))
    # At most one trace (none when an equal dataset compiled these shapes before: the program
    # is module-level); a new shape traces once more, so the count is live.
    assert len(traces) <= 1
    before = len(traces)
    data.get_batch(np.arange(11))
    data.get_batch(np.arange(11, 22))
    assert len(traces) == before + 1


MILLION = 1_000_000


def test_a_million_documents_in_constant_memory_per_document():
    """Tables are O(num_docs); every traced intermediate of a lookup is O(rows), never O(pairs)."""
    lengths = np.random.default_rng(0).integers(1, 65, MILLION)
    spec = dict(
        seq_len=64, content_length=16, content_stride=8, offset_stride=8, content_start_mode="slide_within"
    )
    schedule = meshbatch.splice_schedule(lengths, **spec)
    assert len(schedule) > 30 * MILLION
    leaves = jax.tree.leaves(schedule)
    assert max(x.size for x in leaves) == MILLION + 1
    assert sum(x.nbytes for x in leaves) <= 24 * MILLION + 4 * 64  # 6 words per document + one table
    assert schedule.doc_steps == MILLION.bit_length()  # binary search: log2(num_docs) steps per row

    rows = np.random.default_rng(1).integers(0, len(schedule), 256).astype(np.uint32)
    rows[:2] = [0, len(schedule) - 1]
    jaxpr = jax.make_jaxpr(lambda s, r: lookup_rows(s, r, 0))(schedule, rows)
    assert _largest_intermediate(jaxpr.jaxpr) <= rows.size

    doc, t, s, copy_len = (np.asarray(x) for x in schedule.lookup(rows))
    starts = np.concatenate([[0], np.cumsum(meshbatch.pairs_per_doc(schedule))])
    for row, d in zip(rows.tolist(), doc.tolist(), strict=True):
        pairs = ref_pairs(int(lengths[d]), S=64, K=16, kt=8, ks=8, start_mode="slide_within")
        assert starts[d] <= row < starts[d] + len(pairs)
        assert pairs[row - starts[d]] == (t[rows == row][0], s[rows == row][0], copy_len[rows == row][0])


def _largest_intermediate(jaxpr) -> int:
    largest = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            largest = max(largest, int(np.prod(var.aval.shape)) if hasattr(var.aval, "shape") else 0)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            largest = max(largest, _largest_intermediate(sub))
    return largest


def test_validation_grid_coverage_balanced():
    schedule = meshbatch.splice_schedule(
        [20, 5], seq_len=8, content_length=6, content_start_mode="coverage_balanced",
        offset_jitter=2, jitter_mode="low_discrepancy",
    )  # fmt: skip
    rows = list(
        zip(*(x.tolist() for x in splice_module.validation_rows(schedule, starts=2, offsets=3)), strict=True)
    )
    # doc 0: K_0 = 6, starts 0..14 -> 0, 14; jitter 0..2 -> s = 2, 1, 0.
    # doc 1: K_1 = 5, one start; jitter 0..2 -> s = 3, 2, 1.
    assert rows == [
        (0, 0, 2, 6), (0, 0, 1, 6), (0, 0, 0, 6), (0, 14, 2, 6), (0, 14, 1, 6), (0, 14, 0, 6),
        (1, 0, 3, 5), (1, 0, 2, 5), (1, 0, 1, 5),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "spec",
    [
        dict(content_length=5, content_start_mode="slide_within"),
        dict(content_length=5, content_start_mode="cyclic_roll", eos_token_id=99),
        dict(content_start_mode="coverage_balanced", offset_jitter=2, key=jax.random.key(0)),
    ],
)
def test_plan_and_build_run_sharded_over_the_mesh(spec):
    """Rows sharded on a data axis of 8 devices: same frames, and the batch stays sharded by row."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as Spec

    from meshbatch.kernels.splice.frames import pool_frames

    data = meshbatch.SpliceDataset([np.arange(40), np.arange(9) + 100], seq_len=12, pad_token_id=P, **spec)
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    rows = np.arange(64, dtype=np.uint32) * 7 % len(data)

    @jax.jit
    def plan_build(schedule, pool, rows):
        return pool_frames(pool, *lookup_rows(schedule, rows, 0), **data.frame_args)

    # Tables and pool replicated over the mesh, rows split on the data axis.
    schedule, pool = jax.device_put((data.schedule, data.pool), NamedSharding(mesh, Spec()))
    sharded_rows = jax.device_put(rows, NamedSharding(mesh, Spec("data")))
    sharded = plan_build(schedule, pool, sharded_rows)
    jax.tree.map(np.testing.assert_array_equal, sharded, data.get_batch(rows))
    assert sharded.tokens.sharding.spec[0] == "data"
    with jax.set_mesh(mesh):  # a context mesh as well
        again = plan_build(schedule, pool, sharded_rows)
    jax.tree.map(np.testing.assert_array_equal, again, sharded)
