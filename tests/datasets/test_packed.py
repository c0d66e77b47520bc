"""``PackedDataset``: packed chat and supervised examples through ``Pipeline``.

Every policy (Levanter's greedy packing, first fit over shuffled windows, first fit decreasing,
one example a row) on a chat and a supervised cache equals the plain reference of
``tests/packed_reference.py`` on 1 and 8 devices and on 2 processes x 4 devices; steps after the
first compile nothing; damaged caches are refused naming the cache and the row; the packing
kernels equal the reference rules on random lengths; ``docs/packed.md``'s golden rows hold.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiles import count_compiles
from meshes import mesh_of
from mp_harness import assemble, run_jobs
from packed_corpus import chat_examples, supervised_examples, write_chat_cache, write_supervised_cache
from packed_reference import first_fit_packs, greedy_packs, packs_for, reference_batch

import meshbatch
from meshbatch import PackedDataError, PackedDataset, Pipeline, ShuffleSpec
from meshbatch.kernels import first_fit_rows, greedy_rows, pack_tables

SEQ = 32
BATCH = 8
STEPS = 5
N = 60
LEAVES = ("tokens", "loss_mask", "segment_ids", "positions", "cu_seqlens")
NO_SHUFFLE = ShuffleSpec("none")
POLICIES = {
    "levanter": dict(compat="levanter"),
    "first_fit": dict(window=16),
    "first_fit_decreasing": dict(window=16, decreasing=True),
    "padded": dict(pack=False),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    chat = chat_examples(0, N, max_len=40)
    supervised = supervised_examples(1, N, max_len=40)
    return {
        "chat": (write_chat_cache(root / "chat", chat), chat),
        "supervised": (write_supervised_cache(root / "supervised", supervised), supervised),
    }


def make_dataset(path, policy: str, **extra):
    kwargs = dict(POLICIES[policy], attention_metadata=True, **extra)
    kwargs.setdefault("shuffle", ShuffleSpec("none"))
    return PackedDataset(path, SEQ, **kwargs)


def packed_pipeline(mesh, *, path, policy, shuffle=None, key=3):
    extra = {} if shuffle is None else {"shuffle": ShuffleSpec(shuffle)}
    dataset = make_dataset(path, policy, **extra)
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=key)
    return pipeline, lambda: {"spans": dataset.sources[0].counters.spans_requested}


def reference(examples, fmt, policy, step, *, key=3, host=None, shuffle_spec=NO_SHUFFLE):
    kwargs = POLICIES[policy]
    compat = kwargs.get("compat")
    pack = kwargs.get("pack", True)
    n = len(examples)
    order = np.arange(n)
    if pack and compat is None:  # the keyed shuffle of examples before packing
        shuffle = meshbatch.permutation("feistel", n, jax.random.fold_in(jax.random.key(key), 0x50414344))
        order = np.asarray(shuffle(jnp.arange(n, dtype=jnp.uint32)))
    packs = packs_for(examples, seq_len=SEQ, pack=pack, compat=compat, max_segments=64,
                      window=kwargs.get("window", 512), decreasing=kwargs.get("decreasing", False),
                      example_order=order)  # fmt: skip
    g = np.arange(step * BATCH, (step + 1) * BATCH)
    position, epoch = g % len(packs), g // len(packs)
    if shuffle_spec.strategy == "none":
        pack_ids = position
    else:
        shuffle = shuffle_spec.create(len(packs), jax.random.key(key), default_block=1)
        pack_ids = np.asarray(shuffle_spec.apply(shuffle, jnp.asarray(position, jnp.uint32),
                                                 jnp.asarray(epoch, jnp.uint32)))  # fmt: skip
    rule = "levanter" if compat == "levanter" else "meshbatch"
    slice_strategy = {"chat": "left", "supervised": "right"}[fmt]
    segments = min(64, SEQ) if pack else 1
    return reference_batch(examples, packs, pack_ids, fmt=fmt, seq_len=SEQ, rule=rule, mask_prompt=True,
                           slice_strategy=slice_strategy, segments=segments), len(packs)  # fmt: skip


@pytest.mark.parametrize("fmt", ["chat", "supervised"])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("devices", [1, 8])
def test_packed_batches_equal_reference(corpus, fmt, policy, devices):
    path, examples = corpus[fmt]
    pipeline, _ = packed_pipeline(mesh_of(devices), path=path, policy=policy)
    steps = range(STEPS) if devices == 1 else (0, 3)
    for step in steps:
        batch = pipeline.batch(step)
        want, num_packs = reference(examples, fmt, policy, step)
        assert pipeline._host.num_examples == num_packs
        for name in LEAVES:
            np.testing.assert_array_equal(
                np.asarray(getattr(batch, name)), want[name], err_msg=f"{fmt} {policy} {step=} {name}"
            )
        chex.assert_type([batch.tokens, batch.loss_mask, batch.segment_ids, batch.positions], jnp.int32)


def test_shuffled_rows_equal_reference_across_epochs(corpus):
    """A full shuffle of the packed rows, reshuffled each epoch; the steps cross epoch boundaries."""
    path, examples = corpus["chat"]
    pipeline, _ = packed_pipeline(mesh_of(2), path=path, policy="first_fit", shuffle="full")
    num_packs = pipeline._host.num_examples
    for step in (0, num_packs // BATCH, num_packs // BATCH + 1, 2 * num_packs // BATCH):
        want, _ = reference(examples, "chat", "first_fit", step, shuffle_spec=ShuffleSpec("full"))
        batch = pipeline.batch(step)
        for name in LEAVES:
            np.testing.assert_array_equal(
                np.asarray(getattr(batch, name)), want[name], err_msg=f"{step=} {name}"
            )


def test_every_example_once_per_epoch_and_fill(corpus):
    """The packed rows of an epoch hold every example exactly once; the tighter policies fill more."""
    path, examples = corpus["supervised"]
    fills = {}
    for policy in POLICIES:
        host = make_dataset(path, policy).make(jax.random.key(3))[1]
        tables = host.packing
        assert sorted(np.asarray(tables.members).tolist()) == list(range(N))
        fills[policy] = host.fill()
        kept = sum(min(len(ids), SEQ) for ids, _ in examples)
        assert fills[policy] == pytest.approx(kept / (host.num_examples * SEQ))
    assert fills["padded"] < fills["levanter"] <= fills["first_fit"] <= fills["first_fit_decreasing"]


def test_attention_metadata_is_opt_in(corpus):
    path, _ = corpus["chat"]
    batch = Pipeline(PackedDataset(path, SEQ), mesh=mesh_of(1), batch_size=BATCH, key=0).batch(0)
    assert batch.positions is None and batch.cu_seqlens is None
    with_meta = PackedDataset(path, SEQ, attention_metadata=True, max_segments=5)
    batch = Pipeline(with_meta, mesh=mesh_of(1), batch_size=BATCH, key=0).batch(0)
    assert batch.cu_seqlens.shape == (BATCH, 6)
    lengths = np.diff(np.asarray(batch.cu_seqlens), axis=1)
    assert (lengths >= 0).all() and (
        np.asarray(batch.cu_seqlens)[:, -1] == (np.asarray(batch.segment_ids) >= 0).sum(1)
    ).all()


def test_steps_never_recompile(corpus):
    path, _ = corpus["chat"]
    pipeline, _ = packed_pipeline(mesh_of(8), path=path, policy="first_fit", shuffle="full")
    jax.block_until_ready(pipeline.batch(0))
    with count_compiles(this_thread=True) as compiles:
        for step in range(1, 2 * STEPS):
            jax.block_until_ready(pipeline.batch(step))
    assert compiles == []
    again, _ = packed_pipeline(mesh_of(8), path=path, policy="first_fit", shuffle="full", key=4)
    with count_compiles(this_thread=True) as compiles:
        jax.block_until_ready(again.batch(0))
    assert compiles == []  # another key, another packing: the same programs


def test_packed_equal_across_two_processes(corpus, tmp_path):
    """2 processes x 4 devices: the same batches as the reference, each process reading its rows;
    packed rows under a full shuffle, across an epoch boundary, also equal one process's batches."""
    jobs = [
        ("test_packed:packed_pipeline", {"path": corpus[fmt][0], "policy": policy}, 3)
        for fmt, policy in (("chat", "levanter"), ("supervised", "first_fit"), ("chat", "padded"))
    ]
    shuffled = {"path": corpus["chat"][0], "policy": "first_fit", "shuffle": "full"}
    jobs.append(("test_packed:packed_pipeline", shuffled, 7))
    launched = run_jobs(tmp_path, processes=2, local_devices=4, mesh_shape="8", jobs=jobs)
    for (_, kwargs, steps), results in zip(jobs, launched, strict=True):
        fmt = "chat" if kwargs["path"] == corpus["chat"][0] else "supervised"
        spec = ShuffleSpec(kwargs.get("shuffle", "none"))
        single = packed_pipeline(mesh_of(1), **kwargs)[0] if "shuffle" in kwargs else None
        for step in range(steps):
            want, num_packs = reference(corpus[fmt][1], fmt, kwargs["policy"], step, shuffle_spec=spec)
            one = None if single is None else single.batch(step)
            for name in LEAVES:
                got = assemble(results, step=step, leaf=name, like=want[name])
                np.testing.assert_array_equal(got, want[name], err_msg=f"{kwargs} {step=} {name}")
                if one is not None:
                    np.testing.assert_array_equal(
                        got, np.asarray(getattr(one, name)), err_msg=f"1 process: {kwargs} {step=} {name}"
                    )
        if single is not None:
            assert steps * BATCH > num_packs, "the shuffled job's steps cross an epoch boundary"
        # each process read only its own rows: one span of input_ids per example of its half
        for p, result in enumerate(results):
            members = 0
            for step in range(steps):
                cu = reference(corpus[fmt][1], fmt, kwargs["policy"], step, shuffle_spec=spec)[0][
                    "cu_seqlens"
                ]
                members += int((np.diff(cu, axis=1) > 0)[p * BATCH // 2 : (p + 1) * BATCH // 2].sum())
            assert int(result["report/spans"]) == members, (kwargs, p)


# -- the packing kernels against the reference rules, on random lengths -------------------------


@pytest.mark.parametrize("seed", range(3))
def test_packing_kernels_equal_reference_rules(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 50, 300)
    seq_len, segments = 40, 4
    rows = np.asarray(greedy_rows(jnp.asarray(lengths, jnp.int32), jnp.int32(seq_len), max_segments=segments))
    packs = greedy_packs(lengths.tolist(), seq_len, segments)
    assert [list(map(int, np.flatnonzero(rows == r))) for r in range(rows.max() + 1)] == packs
    sizes = np.minimum(lengths, seq_len)
    for decreasing in (False, True):
        rows = first_fit_rows(jnp.asarray(sizes, jnp.int32), jnp.int32(seq_len), max_segments=segments,
                              window=64, decreasing=decreasing)  # fmt: skip
        tables = pack_tables(rows, jnp.asarray(sizes, jnp.int32), decreasing=decreasing)
        members, start = np.asarray(tables.members), np.asarray(tables.row_start)
        got = [members[start[r] : start[r + 1]].tolist() for r in range(int(tables.num_rows))]
        assert got == first_fit_packs(list(range(300)), lengths.tolist(), seq_len, segments, 64, decreasing)


# -- golden rows (docs/packed.md) ---------------------------------------------------------------

GOLDEN_CHAT = [  # (ids, assistant_masks)
    ([11, 12, 13, 14, 15], [0, 0, 1, 1, 1]),
    ([21, 22, 23, 24], [0, 1, 1, 1]),
    ([31, 32, 33], [1, 1, 0]),
    ([41, 42], [0, 1]),
    ([51, 52, 53, 54, 55, 56, 57, 58, 59, 60], [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]),
]
GOLDEN_SUPERVISED = [  # (ids, sources_len)
    ([11, 12, 13, 14, 15], 2),
    ([21, 22, 23, 24], 1),
    ([31, 32, 33], 2),
    ([41, 42], 1),
    ([51, 52, 53, 54, 55, 56, 57, 58, 59, 60], 3),
]
GOLDEN_ROWS = {  # (format, rule, options) -> rows of 8: tokens, loss_mask, segment_ids, positions, cu_seqlens
    # compat="levanter": greedy in cache order -> rows [0] [1 2] [3] [4]
    ("chat", "levanter", "packed"): [
        (
            [11, 12, 13, 14, 15, 0, 0, 0],
            [0, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, -1, -1, -1],
            [0, 1, 2, 3, 4, 0, 0, 0],
            [0, 5, 5, 5, 5],
        ),
        (
            [21, 22, 23, 24, 31, 32, 33, 0],
            [1, 1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 2, 2, 2, -1],
            [0, 1, 2, 3, 0, 1, 2, 0],
            [0, 4, 7, 7, 7],
        ),
        (
            [41, 42, 0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 0],
            [3, 3, -1, -1, -1, -1, -1, -1],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [0, 2, 2, 2, 2],
        ),
        (
            [51, 52, 53, 54, 55, 56, 57, 58],
            [0, 0, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8, 8, 8, 8],
        ),
    ],
    ("supervised", "levanter", "packed"): [
        (
            [11, 12, 13, 14, 15, 0, 0, 0],
            [0, 0, 1, 1, 1, 0, 0, 0],
            [0, 0, 0, 0, 0, -1, -1, -1],
            [0, 1, 2, 3, 4, 0, 0, 0],
            [0, 5, 5, 5, 5],
        ),
        (
            [21, 22, 23, 24, 31, 32, 33, 0],
            [0, 1, 1, 1, 0, 0, 1, 0],
            [1, 1, 1, 1, 2, 2, 2, -1],
            [0, 1, 2, 3, 0, 1, 2, 0],
            [0, 4, 7, 7, 7],
        ),
        (
            [41, 42, 0, 0, 0, 0, 0, 0],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [3, 3, -1, -1, -1, -1, -1, -1],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [0, 2, 2, 2, 2],
        ),
        (
            [53, 54, 55, 56, 57, 58, 59, 60],
            [0, 0, 0, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8, 8, 8, 8],
        ),
    ],
    # the default rule, first fit over one window of the 5 examples in cache order -> rows [0 2] [1 3] [4]
    ("chat", "meshbatch", "packed"): [
        (
            [11, 12, 13, 14, 15, 31, 32, 33],
            [0, 1, 1, 1, 0, 1, 0, 0],
            [0, 0, 0, 0, 0, 2, 2, 2],
            [0, 1, 2, 3, 4, 0, 1, 2],
            [0, 5, 8, 8, 8],
        ),
        (
            [21, 22, 23, 24, 41, 42, 0, 0],
            [1, 1, 1, 0, 1, 0, 0, 0],
            [1, 1, 1, 1, 3, 3, -1, -1],
            [0, 1, 2, 3, 0, 1, 0, 0],
            [0, 4, 6, 6, 6],
        ),
        (
            [51, 52, 53, 54, 55, 56, 57, 58],
            [0, 0, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8, 8, 8, 8],
        ),
    ],
    ("supervised", "meshbatch", "packed"): [
        (
            [11, 12, 13, 14, 15, 31, 32, 33],
            [0, 1, 1, 1, 0, 0, 1, 0],
            [0, 0, 0, 0, 0, 2, 2, 2],
            [0, 1, 2, 3, 4, 0, 1, 2],
            [0, 5, 8, 8, 8],
        ),
        (
            [21, 22, 23, 24, 41, 42, 0, 0],
            [1, 1, 1, 0, 1, 0, 0, 0],
            [1, 1, 1, 1, 3, 3, -1, -1],
            [0, 1, 2, 3, 0, 1, 0, 0],
            [0, 4, 6, 6, 6],
        ),
        (
            [53, 54, 55, 56, 57, 58, 59, 60],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8, 8, 8, 8],
        ),
    ],
    # mask_prompt=False, compat: every position but the row's last, padding included (Levanter's causal mask)
    ("chat", "levanter", "mask_prompt=False"): [
        (
            [11, 12, 13, 14, 15, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, -1, -1, -1],
            [0, 1, 2, 3, 4, 0, 0, 0],
            [0, 5, 5, 5, 5],
        ),
        (
            [21, 22, 23, 24, 31, 32, 33, 0],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 2, 2, 2, -1],
            [0, 1, 2, 3, 0, 1, 2, 0],
            [0, 4, 7, 7, 7],
        ),
        (
            [41, 42, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [3, 3, -1, -1, -1, -1, -1, -1],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [0, 2, 2, 2, 2],
        ),
        (
            [51, 52, 53, 54, 55, 56, 57, 58],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8, 8, 8, 8],
        ),
    ],
    ("supervised", "levanter", "mask_prompt=False"): [
        (
            [11, 12, 13, 14, 15, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, -1, -1, -1],
            [0, 1, 2, 3, 4, 0, 0, 0],
            [0, 5, 5, 5, 5],
        ),
        (
            [21, 22, 23, 24, 31, 32, 33, 0],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 2, 2, 2, -1],
            [0, 1, 2, 3, 0, 1, 2, 0],
            [0, 4, 7, 7, 7],
        ),
        (
            [41, 42, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [3, 3, -1, -1, -1, -1, -1, -1],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [0, 2, 2, 2, 2],
        ),
        (
            [53, 54, 55, 56, 57, 58, 59, 60],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8, 8, 8, 8],
        ),
    ],
    # mask_prompt=False, the default rule: every token but each example's last; padding 0
    ("chat", "meshbatch", "mask_prompt=False"): [
        (
            [11, 12, 13, 14, 15, 31, 32, 33],
            [1, 1, 1, 1, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 2, 2, 2],
            [0, 1, 2, 3, 4, 0, 1, 2],
            [0, 5, 8, 8, 8],
        ),
        (
            [21, 22, 23, 24, 41, 42, 0, 0],
            [1, 1, 1, 0, 1, 0, 0, 0],
            [1, 1, 1, 1, 3, 3, -1, -1],
            [0, 1, 2, 3, 0, 1, 0, 0],
            [0, 4, 6, 6, 6],
        ),
        (
            [51, 52, 53, 54, 55, 56, 57, 58],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8, 8, 8, 8],
        ),
    ],
    ("supervised", "meshbatch", "mask_prompt=False"): [
        (
            [11, 12, 13, 14, 15, 31, 32, 33],
            [1, 1, 1, 1, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 2, 2, 2],
            [0, 1, 2, 3, 4, 0, 1, 2],
            [0, 5, 8, 8, 8],
        ),
        (
            [21, 22, 23, 24, 41, 42, 0, 0],
            [1, 1, 1, 0, 1, 0, 0, 0],
            [1, 1, 1, 1, 3, 3, -1, -1],
            [0, 1, 2, 3, 0, 1, 0, 0],
            [0, 4, 6, 6, 6],
        ),
        (
            [53, 54, 55, 56, 57, 58, 59, 60],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8, 8, 8, 8],
        ),
    ],
    # pack=False: one example a row in cache order, one member slot (cu_seqlens [0, end])
    ("chat", "meshbatch", "pack=False"): [
        (
            [11, 12, 13, 14, 15, 0, 0, 0],
            [0, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, -1, -1, -1],
            [0, 1, 2, 3, 4, 0, 0, 0],
            [0, 5],
        ),
        (
            [21, 22, 23, 24, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, -1, -1, -1, -1],
            [0, 1, 2, 3, 0, 0, 0, 0],
            [0, 4],
        ),
        (
            [31, 32, 33, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 0],
            [2, 2, 2, -1, -1, -1, -1, -1],
            [0, 1, 2, 0, 0, 0, 0, 0],
            [0, 3],
        ),
        (
            [41, 42, 0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 0],
            [3, 3, -1, -1, -1, -1, -1, -1],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [0, 2],
        ),
        (
            [51, 52, 53, 54, 55, 56, 57, 58],
            [0, 0, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8],
        ),
    ],
    # compat: chat masks shifted by one; alone in its row, an example's last token meets padding's 0
    ("chat", "levanter", "pack=False"): [
        (
            [11, 12, 13, 14, 15, 0, 0, 0],
            [0, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, -1, -1, -1],
            [0, 1, 2, 3, 4, 0, 0, 0],
            [0, 5],
        ),
        (
            [21, 22, 23, 24, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, -1, -1, -1, -1],
            [0, 1, 2, 3, 0, 0, 0, 0],
            [0, 4],
        ),
        (
            [31, 32, 33, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 0],
            [2, 2, 2, -1, -1, -1, -1, -1],
            [0, 1, 2, 0, 0, 0, 0, 0],
            [0, 3],
        ),
        (
            [41, 42, 0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 0],
            [3, 3, -1, -1, -1, -1, -1, -1],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [0, 2],
        ),
        (
            [51, 52, 53, 54, 55, 56, 57, 58],
            [0, 0, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8],
        ),
    ],
    ("supervised", "meshbatch", "pack=False"): [
        (
            [11, 12, 13, 14, 15, 0, 0, 0],
            [0, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, -1, -1, -1],
            [0, 1, 2, 3, 4, 0, 0, 0],
            [0, 5],
        ),
        (
            [21, 22, 23, 24, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, -1, -1, -1, -1],
            [0, 1, 2, 3, 0, 0, 0, 0],
            [0, 4],
        ),
        (
            [31, 32, 33, 0, 0, 0, 0, 0],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [2, 2, 2, -1, -1, -1, -1, -1],
            [0, 1, 2, 0, 0, 0, 0, 0],
            [0, 3],
        ),
        (
            [41, 42, 0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0, 0],
            [3, 3, -1, -1, -1, -1, -1, -1],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [0, 2],
        ),
        (
            [53, 54, 55, 56, 57, 58, 59, 60],
            [1, 1, 1, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8],
        ),
    ],
    # compat: p >= sources_len, so each example's last token is trained to predict the padding
    ("supervised", "levanter", "pack=False"): [
        (
            [11, 12, 13, 14, 15, 0, 0, 0],
            [0, 0, 1, 1, 1, 0, 0, 0],
            [0, 0, 0, 0, 0, -1, -1, -1],
            [0, 1, 2, 3, 4, 0, 0, 0],
            [0, 5],
        ),
        (
            [21, 22, 23, 24, 0, 0, 0, 0],
            [0, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, -1, -1, -1, -1],
            [0, 1, 2, 3, 0, 0, 0, 0],
            [0, 4],
        ),
        (
            [31, 32, 33, 0, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0, 0, 0],
            [2, 2, 2, -1, -1, -1, -1, -1],
            [0, 1, 2, 0, 0, 0, 0, 0],
            [0, 3],
        ),
        (
            [41, 42, 0, 0, 0, 0, 0, 0],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [3, 3, -1, -1, -1, -1, -1, -1],
            [0, 1, 0, 0, 0, 0, 0, 0],
            [0, 2],
        ),
        (
            [53, 54, 55, 56, 57, 58, 59, 60],
            [0, 0, 0, 1, 1, 1, 1, 0],
            [4] * 8,
            [0, 1, 2, 3, 4, 5, 6, 7],
            [0, 8],
        ),
    ],
}


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    chat = [(np.array(i, np.int32), np.array(m, np.int32)) for i, m in GOLDEN_CHAT]
    supervised = [(np.array(i, np.int32), s) for i, s in GOLDEN_SUPERVISED]
    return {
        "chat": write_chat_cache(root / "chat", chat),
        "supervised": write_supervised_cache(root / "sup", supervised),
    }


GOLDEN_OPTIONS = {"packed": {}, "mask_prompt=False": dict(mask_prompt=False), "pack=False": dict(pack=False)}


@pytest.mark.parametrize("fmt, rule, options", list(GOLDEN_ROWS))
def test_golden_rows(golden, fmt, rule, options):
    """docs/packed.md's worked traces: 5 examples into rows of 8 tokens, at most 4 examples a row."""
    kwargs = dict(GOLDEN_OPTIONS[options])
    if rule == "levanter":
        kwargs["compat"] = "levanter"
    elif kwargs.get("pack", True):  # first fit's options (refused with pack=False)
        kwargs.update(shuffle_examples=False, window=5)
    dataset = PackedDataset(
        golden[fmt], 8, max_segments=4, shuffle=NO_SHUFFLE, attention_metadata=True, **kwargs
    )
    want = GOLDEN_ROWS[fmt, rule, options]
    batch = Pipeline(dataset, mesh=mesh_of(1), batch_size=len(want), key=0).batch(0)
    for k, name in enumerate(LEAVES):
        np.testing.assert_array_equal(
            np.asarray(getattr(batch, name)), np.array([row[k] for row in want]), name
        )


# -- damaged input and bad arguments ------------------------------------------------------------


def _write_raw_chat(path, ids_rows, mask_rows):
    from levanter.store.cache import SerialCacheWriter

    exemplar = {"input_ids": np.zeros((0,), np.int32), "assistant_masks": np.zeros((0,), np.int32)}
    with SerialCacheWriter(str(path), exemplar) as writer:
        writer.write_batch([{"input_ids": np.array(i, np.int32), "assistant_masks": np.array(m, np.int32)}
                            for i, m in zip(ids_rows, mask_rows, strict=True)])  # fmt: skip
    return str(path)


def test_damaged_input_is_named(tmp_path, monkeypatch):
    path = _write_raw_chat(tmp_path / "short_mask", [[1, 2, 3], [4, 5, 6, 7]], [[0, 1, 1], [0, 1, 1]])
    with pytest.raises(PackedDataError, match=r"chat cache .*short_mask: row 1 has 3 assistant_masks for 4"):
        PackedDataset(path, 8)
    from meshbatch.datasets.packed import packed_sources

    # the bad value is token 6 of the field; checked 3 tokens a read, it begins the third read
    for name, value, chunk in (("mask_two", 2, None), ("mask_negative", -1, 3)):
        if chunk is not None:
            monkeypatch.setattr(packed_sources, "MASK_CHECK_TOKENS", chunk)
        path = _write_raw_chat(
            tmp_path / name, [[1, 2, 3], [4, 5], [6, 7, 8]], [[0, 1, 1], [0, 1], [0, value, 1]]
        )
        with pytest.raises(
            PackedDataError,
            match=rf"chat cache .*{name}: row 2 has assistant_masks value {value} at its token 1",
        ):
            PackedDataset(path, 8)
    path = _write_raw_chat(tmp_path / "empty", [[1, 2, 3], [], [4, 5]], [[0, 1, 1], [], [0, 1]])
    with pytest.raises(PackedDataError, match=r"chat cache .*empty: row 1 is an empty example"):
        PackedDataset(path, 8)
    path = write_supervised_cache(
        tmp_path / "past", [(np.arange(4, dtype=np.int32), 2), (np.arange(3, dtype=np.int32), 5)]
    )
    with pytest.raises(
        PackedDataError, match=r"supervised cache .*past: row 1 has sources_len=5, past its example of 3"
    ):
        PackedDataset(path, 8)
    path = write_supervised_cache(
        tmp_path / "negative", [(np.arange(4, dtype=np.int32), 2), (np.arange(3, dtype=np.int32), -1)]
    )
    with pytest.raises(
        PackedDataError,
        match=r"supervised cache .*negative: row 1 has sources_len=-1, a negative prompt length",
    ):
        PackedDataset(path, 8)
    path = write_supervised_cache(
        tmp_path / "long", [(np.arange(4, dtype=np.int32), 2), (np.arange(12, dtype=np.int32), 5)]
    )
    with pytest.raises(
        PackedDataError, match=r"row 1 has 12 tokens, longer than seq_len=8 \(slice_strategy='raise'"
    ):
        PackedDataset(path, 8, slice_strategy="raise")
    assert PackedDataset(path, 8, compat="levanter").num_examples == 2  # Levanter's rule: sliced
    from levanter.store.cache import SerialCacheWriter

    exemplar = {"input_ids": np.zeros((0,), np.int32), "sources_len": np.zeros((0,), np.int32)}
    with SerialCacheWriter(str(tmp_path / "two_values"), exemplar) as writer:
        rows = [
            {"input_ids": np.arange(5, dtype=np.int32), "sources_len": np.array(v, np.int32)}
            for v in ([2], [1, 3])
        ]
        writer._tree_store.extend_with_batch(writer._tree_store.batch_preparer(rows))
    with pytest.raises(
        PackedDataError, match=r"supervised cache .*two_values: row 1 of sources_len holds 2 values"
    ):
        PackedDataset(str(tmp_path / "two_values"), 8)


def test_bad_arguments_are_named(corpus, tmp_path):
    from meshbatch.cache import CacheWriter

    with CacheWriter(str(tmp_path / "text")) as writer:
        writer.write([np.arange(5, dtype=np.int32)])
    with pytest.raises(ValueError, match=r"cannot tell the format of the cache at .*neither assistant_masks"):
        PackedDataset(str(tmp_path / "text"), SEQ)
    path = corpus["chat"][0]
    with pytest.raises(ValueError, match="compat='levanter' packs greedily in cache order: decreasing=True"):
        PackedDataset(path, SEQ, compat="levanter", decreasing=True)
    with pytest.raises(
        ValueError, match="pack=False packs nothing: window=8, shuffle_examples=False configure"
    ):
        PackedDataset(path, SEQ, pack=False, window=8, shuffle_examples=False)
    with pytest.raises(TypeError, match="decreasing"):
        PackedDataset(path, SEQ, decreasing="yes")
    with pytest.raises(ValueError, match=r"compat='levantr' is not one of"):
        PackedDataset(path, SEQ, compat="levantr")
    with pytest.raises(ValueError, match="slice_strategy='middle'"):
        PackedDataset(path, SEQ, slice_strategy="middle")
    with pytest.raises(ValueError, match="seq_len must be >= 1"):
        PackedDataset(path, 0)
    with pytest.raises(FileNotFoundError):
        PackedDataset(path, SEQ, format="supervised")
    with pytest.raises(
        AttributeError, match=r"num_examples is known on the dataset PackedDataset.make\(key\)"
    ):
        _ = PackedDataset(path, SEQ).num_examples


def test_packed_child_of_mixtures(corpus, tmp_path):
    """A text cache and a packed chat cache in a stable and a token-balanced mixture: every row is one
    of the text windows or one of the chat cache's packed rows, and both kinds appear. (A packing that
    depends on the key, the default's shuffle of examples, is known only after make: a mixture,
    which counts its children's rows when constructed, takes a key-free one.)"""
    from meshbatch import CausalLMDataset, Mixture, TokenBalancedMixture
    from meshbatch.cache import CacheWriter, TokenCache

    with CacheWriter(str(tmp_path / "text")) as writer:
        writer.write([np.arange(3, 3 + 7 * SEQ, dtype=np.int32) + 1000 * i for i in range(6)])
    text = CausalLMDataset(TokenCache.open(str(tmp_path / "text")), SEQ)
    chat = PackedDataset(corpus["chat"][0], SEQ, shuffle_examples=False, window=16)
    flat = np.concatenate(TokenCache.open(str(tmp_path / "text")).read_rows(range(6)))
    windows = {tuple(w) for w in flat.reshape(-1, SEQ).tolist()}
    in_order = PackedDataset(corpus["chat"][0], SEQ, shuffle_examples=False, window=16, shuffle=NO_SHUFFLE)
    packed = Pipeline(in_order, mesh=mesh_of(1), batch_size=chat.num_examples, key=0).batch(0)
    packed_rows = {tuple(r) for r in np.asarray(packed.tokens).tolist()}
    for mixture in (
        Mixture({"text": text, "chat": chat}, {"text": 0.5, "chat": 0.5}, block_size=16),
        TokenBalancedMixture({"text": text, "chat": chat}),
    ):
        pipeline = Pipeline(mixture, mesh=mesh_of(2), batch_size=BATCH, key=1)
        kinds = set()
        for step in range(4):
            for row in np.asarray(pipeline.batch(step).tokens).tolist():
                kind = "text" if tuple(row) in windows else "chat" if tuple(row) in packed_rows else None
                assert kind is not None, (type(mixture).__name__, step, row)
                kinds.add(kind)
        assert kinds == {"text", "chat"}, type(mixture).__name__


@pytest.mark.parametrize("policy", ["levanter", "first_fit"])
def test_provenance_names_each_rows_examples(corpus, policy):
    """``Pipeline.provenance``: each row's input_ids spans, back to back, are its tokens, and the
    span's document is the segment id there; nothing else in the row but padding."""
    path, examples = corpus["chat"]
    pipeline, _ = packed_pipeline(mesh_of(2), path=path, policy=policy, shuffle="full")
    flat = np.concatenate([ids for ids, _ in examples])
    offsets = np.concatenate([[0], np.cumsum([len(ids) for ids, _ in examples])])
    for step in (0, 3):
        prov = pipeline.provenance(step)
        batch = pipeline.batch(step)
        tokens, segments = np.asarray(batch.tokens), np.asarray(batch.segment_ids)
        for row in range(BATCH):
            covered = np.zeros(SEQ, bool)
            for j in range(prov.rows.slots):
                length = int(prov.rows.length[row, j])
                if length == 0:
                    continue
                start, at, doc = (int(prov.rows.start[row, j]), int(prov.rows.row_offset[row, j]),
                                  int(prov.rows.doc[row, j]))  # fmt: skip
                np.testing.assert_array_equal(tokens[row, at : at + length], flat[start : start + length])
                assert (segments[row, at : at + length] == doc).all()
                assert offsets[doc] + int(prov.rows.doc_start[row, j]) == start
                covered[at : at + length] = True
            assert (segments[row, ~covered] == -1).all() and (tokens[row, ~covered] == 0).all()
