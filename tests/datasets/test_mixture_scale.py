"""Mixtures at scale: hundreds of sources, and counts that never wrap.

Many sources: the stable mixture at 256 sources equals the Python reference, and at 64 sources
Levanter's own ``MixtureDataset`` (``compat="levanter"``); the interleave at hundreds of
sources is tested in ``test_interleave_tree.py``.

Counts never wrap: a component past 2^31 (and 2^32) rows, stable and token-balanced, against a
numpy int64 reference, reached by arithmetic (a huge row, a huge state), never by iterating.

Levanter's ``MixtureDataset`` keeps a stage's per-component counts in int32, which would wrap
after 2^31 rows of a component; meshbatch's kernels are 32-bit too but never form such a count
in one word (stable: 64-bit long division in uint32; token-balanced: two-word counts and
``(position, epoch)`` rows).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from corpora import random_docs, sliding_frames, write_docs
from interleave_reference import select_merge, select_scan
from mixture_reference import block_permutation, counts_per_block, least_consumed, levanter_rows, stable_rows

import meshbatch
from meshbatch import CausalLMDataset, ShuffleSpec, TokenBalancedMixture
from meshbatch.arguments import as_key
from meshbatch.cache import CacheWriter, TokenCache
from meshbatch.datasets import Rows
from meshbatch.datasets.mixtures import CountOverflowError, token_balanced
from meshbatch.kernels import select_tournament
from meshbatch.pipeline.programs import plan_program

INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(("sources", "compat"), [(256, None), (64, "levanter")])
def test_stable_many_sources_equal_references(sources, compat):
    """256 consecutive rows from row 10^6 (lengths 50 .. 305: wraps; weights 1 to 4, one source
    switched to a tiny weight) equal the reference: Python integers (default) or Levanter's own
    ``MixtureDataset.get_batch`` (``compat="levanter"``)."""
    lengths = {f"s{i:03d}": 50 + i for i in range(sources)}
    weights = {name: 1.0 + i % 4 for i, name in enumerate(lengths)}
    weights["s001"] = 0.3
    block_size = 4 * sources
    schedule = meshbatch.mixture_schedule(lengths, weights, block_size=block_size, key=3, compat=compat)
    rows = np.arange(10**6, 10**6 + 256)
    source, index, epoch = (np.asarray(x).tolist() for x in schedule.locate(jnp.asarray(rows, jnp.uint32)))
    if compat == "levanter":
        assert list(zip(source, index, strict=True)) == levanter_rows(lengths, weights, block_size, 3, rows)
    else:
        want = stable_rows(lengths, weights, block_size, jax.random.key(3), rows)
        assert list(zip(source, index, epoch, strict=True)) == want


@pytest.mark.parametrize("compat", [None, "levanter"])
@pytest.mark.parametrize("target", [2**31, 2**32])
def test_stable_component_past_2_31_rows(compat, target):
    """Rows around the one where source ``a`` reads its ``target``-th row (2^31: an int32 count
    wraps; 2^32: a uint32 one would), each ``(source, index, epoch)`` equal to int64 arithmetic."""
    lengths = {"a": 2**31 + 11, "b": 1000, "c": 3}
    weights = {"a": 0.7, "b": 0.2, "c": 0.1}
    block_size = 1000
    names = list(lengths)
    key = jax.random.key(7)
    schedule = meshbatch.mixture_schedule(lengths, weights, block_size=block_size, key=7, compat=compat)
    counts = np.asarray(counts_per_block(names, weights, block_size, compat), np.int64)
    first = np.concatenate([[0], np.cumsum(counts)])
    block = target // int(counts[0])  # a's reads of this block straddle target
    rows = np.arange(block * block_size - 500, (block + 1) * block_size + 500, dtype=np.int64)
    per_pass = int(schedule.num_rows)
    source, index, epoch = schedule.locate(
        jnp.asarray((rows % per_pass).astype(np.uint32)), int(block * block_size // per_pass)
    )
    assert (rows // per_pass == rows[0] // per_pass).all()  # one pass (Levanter: the whole run)

    blocks, position = rows // block_size, rows % block_size
    ids = np.stack([block_permutation(key, int(b), block_size, compat) for b in np.unique(blocks)])
    ident = ids[blocks - blocks[0], position].astype(np.int64)
    want_source = np.searchsorted(first, ident, side="right") - 1
    reads = blocks * counts[want_source] + ident - first[want_source]  # int64, no wrap
    length = np.asarray([lengths[n] for n in names], np.int64)[want_source]
    assert reads[want_source == 0].min() < target <= reads[want_source == 0].max()
    np.testing.assert_array_equal(np.asarray(source), want_source)
    np.testing.assert_array_equal(np.asarray(index).astype(np.int64), reads % length)
    np.testing.assert_array_equal(np.asarray(epoch).astype(np.int64), reads // length)


@pytest.mark.parametrize("compat", [None, "levanter"])
def test_stable_source_epoch_past_2_32_is_refused(compat):
    """A one-row source's epoch is its read count: rows around its 2^32-th read (block about
    1.4e9, far below 2^32 blocks) are exact below it and refused (source ``WRAPPED``, the index
    and epoch ``INVALID``) from it on, never a wrong index; the other source's rows stay exact.
    Each expected ``(source, index, epoch)`` is int64 arithmetic."""
    lengths = {"a": 1, "b": 10**6}
    weights = {"a": 0.75, "b": 0.25}
    block_size = 4
    names = list(lengths)
    schedule = meshbatch.mixture_schedule(lengths, weights, block_size=block_size, key=3, compat=compat)
    counts = np.asarray(counts_per_block(names, weights, block_size, compat), np.int64)
    first = np.concatenate([[0], np.cumsum(counts)])
    block = 2**32 // int(counts[0])  # a's reads of this block straddle 2^32
    rows = np.arange((block - 2) * block_size, (block + 3) * block_size, dtype=np.int64)
    per_pass = int(schedule.num_rows)
    assert (rows // per_pass == rows[0] // per_pass).all()
    source, index, epoch = (
        np.asarray(x).astype(np.int64)
        for x in schedule.locate(jnp.asarray((rows % per_pass).astype(np.uint32)), int(rows[0] // per_pass))
    )

    blocks, position = rows // block_size, rows % block_size
    key = jax.random.key(3)
    ids = np.stack([block_permutation(key, int(b), block_size, compat) for b in np.unique(blocks)])
    ident = ids[blocks - blocks[0], position].astype(np.int64)
    want_source = np.searchsorted(first, ident, side="right") - 1
    reads = blocks * counts[want_source] + ident - first[want_source]
    want_epoch = reads // np.asarray([lengths[n] for n in names], np.int64)[want_source]
    fits = want_epoch < 2**32
    assert fits.any() and (~fits).any() and (want_source[~fits] == 0).all()
    np.testing.assert_array_equal(source, np.where(fits, want_source, meshbatch.kernels.internal.WRAPPED))
    np.testing.assert_array_equal(epoch, np.where(fits, want_epoch, meshbatch.kernels.INVALID))
    np.testing.assert_array_equal(index[fits], (reads % np.asarray([1, 10**6])[want_source])[fits])
    assert (index[~fits] == meshbatch.kernels.INVALID).all()


def test_mixture_row_past_a_source_epoch_names_the_cause(tmp_path):
    """A real ``Mixture`` of a one-row child: the plan of the rows at its 2^32-th read refuses
    them, and the host half says why (an ``OverflowError`` naming the row, not "past the end")."""
    rng = np.random.default_rng(2)
    for name, docs in (("one", [16]), ("many", [40] * 5)):
        with CacheWriter(str(tmp_path / name)) as writer:
            writer.write([rng.integers(2, 999, n).astype(np.int32) for n in docs])
    children = {
        name: CausalLMDataset(TokenCache.open(str(tmp_path / name)), 16, shuffle=ShuffleSpec("none"))
        for name in ("one", "many")
    }
    assert children["one"].num_examples == 1
    mixture = meshbatch.Mixture(children, {"one": 0.75, "many": 0.25}, block_size=4)
    device, host = mixture.make(jax.random.key(0))
    global_rows = np.arange(4 * (2**32 // 3) - 8, 4 * (2**32 // 3) + 8, dtype=np.int64)
    per_pass = mixture.num_examples
    rows = Rows(
        jnp.asarray((global_rows % per_pass).astype(np.uint32)),
        jnp.asarray((global_rows // per_pass).astype(np.uint32)),
    )
    plan, _ = device.plan(rows, None)
    source = np.asarray(plan.source)
    assert (source == meshbatch.kernels.internal.WRAPPED).any() and (source == 0).any()
    bad = int(np.flatnonzero(source < 0)[0])
    with pytest.raises(OverflowError, match=f"row {bad} of the batch: its source would start its 2\\^32-th"):
        host.spans(plan)


SEQ, BATCH = 16, 32


@pytest.fixture(scope="module")
def children(tmp_path_factory):
    """Causal windows of two caches and splice frames of a third (real tokens: copy lengths)."""
    root = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(1)
    caches = [
        TokenCache.open(write_docs(root / f"c{k}", random_docs(rng, docs, (2, 999), (3, 70))))
        for k, docs in enumerate((30, 9, 7))
    ]
    return {
        "a": CausalLMDataset(caches[0], SEQ, shuffle=ShuffleSpec("none"), eos_id=1),
        "b": CausalLMDataset(caches[1], SEQ, shuffle=ShuffleSpec("full"), eos_id=1),
        "c": sliding_frames(caches[2], SEQ, 9, eos=1),
    }


@pytest.mark.parametrize("epochs_before", [2**32 - 2, 2**32 - 1])
def test_balanced_child_epoch_never_wraps(tmp_path, epochs_before):
    """A one-row child (its row offset is its epoch) at epoch ``epochs_before``, the least
    consumed, takes every row of a step: a step that leaves it at epoch 2^32 - 1 is exact, one row
    more is refused (an error naming the specs, never an epoch that wraps to 0)."""
    rng = np.random.default_rng(4)
    for name, docs in (("a", 1), ("b", 10)):
        with CacheWriter(str(tmp_path / name)) as writer:
            writer.write([rng.integers(2, 999, 20).astype(np.int32) for _ in range(docs)])
    kids = {
        n: CausalLMDataset(TokenCache.open(str(tmp_path / n)), 16, shuffle=ShuffleSpec("none")) for n in "ab"
    }
    mixture = TokenBalancedMixture(kids)
    assert mixture.lengths[0] == 1
    start = {
        "datasets": [
            {"spec": "a", "row_offset": epochs_before, "token_offset": 0},
            {"spec": "b", "row_offset": 0, "token_offset": 10**6},
        ]
    }
    device = mixture.make(as_key(0))[0]

    def step(n):
        rows = Rows(jnp.arange(n, dtype=jnp.uint32), jnp.zeros(n, jnp.uint32))
        before = mixture.load_state_dict(start)
        plan, after = plan_program(device, rows, before)
        mixture.check_state(0, before, after)  # the host's check of the step
        return plan, after

    room = 2**32 - 1 - epochs_before  # rows a may still give: its last epoch is 2^32 - 1
    if room:
        plan, state = step(room)
        assert np.asarray(plan.source).tolist() == [0] * room
        assert mixture.state_dict(state)["datasets"][0]["row_offset"] == epochs_before + room
    with pytest.raises(CountOverflowError, match=r"would start its 2\^32-th epoch .*: \['a'\]"):
        step(room + 1)


@pytest.mark.parametrize(
    "select", [select_tournament, select_merge, select_scan], ids=["tournament", "merge", "scan"]
)
def test_balanced_component_past_2_31_rows(children, monkeypatch, select):
    """A state where ``a`` has given 2^31 - 20 rows and ``b`` 2^32 - 10 (tokens just below 2^33):
    three steps of 32 rows carry both past 2^31 and 2^32 rows; every pick,
    every child row ``(position, epoch)`` and the final offsets equal an int64 reference (the
    heap rule over the children's real tokens of rows ``divmod(row_offset + j, length)``)."""
    # each kernel in the mixture's plan: the pipeline's (the tournament) and the two equal ones;
    # a plan program of this test's own, so no other test's trace of the plan is reused
    traced = []

    def spy(*args):
        traced.append(1)
        return select(*args)

    monkeypatch.setattr(token_balanced, "select_tournament", spy)
    plan_mixture = eqx.filter_jit(lambda device, rows, state: device.plan(rows, state))
    dataset = TokenBalancedMixture(children)
    rows = {"a": 2**31 - 20, "b": 2**32 - 10, "c": 5}
    tokens = {"a": 2**33 - 100, "b": 2**33 - 60, "c": 2**33 - 80}
    start = {"datasets": [{"spec": n, "row_offset": rows[n], "token_offset": tokens[n]} for n in rows]}
    device = dataset.make(as_key(3))[0]
    state = dataset.load_state_dict(start)
    batch_rows = Rows(jnp.arange(BATCH, dtype=jnp.uint32), jnp.zeros(BATCH, jnp.uint32))
    picked = []
    for _ in range(3):
        made, state = plan_mixture(device, batch_rows, state)
        picked.append((np.asarray(made.source), np.asarray(made.example)))
    assert traced, "the plan did not call the kernel under test"

    lengths = np.asarray([child.num_examples for child in dataset.children], np.int64)
    offsets = np.asarray([rows[n] for n in dataset.names], np.int64)
    table = []
    for c in range(len(dataset.children)):
        ahead = offsets[c] + np.arange(3 * BATCH, dtype=np.int64)
        child_rows = Rows(
            jnp.asarray(ahead % lengths[c], jnp.uint32), jnp.asarray(ahead // lengths[c], jnp.uint32)
        )
        child_plan, _ = plan_program(device.children[c], child_rows, None)
        table.append(np.asarray(device.children[c].real_tokens(child_plan)).astype(np.int64))
    table = np.stack(table)
    salts = [int(s) for s in np.asarray(device.salts)]
    order, final = least_consumed([tokens[n] for n in dataset.names], table, salts)
    want_source = np.asarray([s for s, _ in order])
    want_example = np.asarray([(offsets[s] + j) % lengths[s] for s, j in order])
    np.testing.assert_array_equal(np.concatenate([s for s, _ in picked]), want_source)
    np.testing.assert_array_equal(np.concatenate([e for _, e in picked]).astype(np.int64), want_example)

    taken = np.bincount(want_source, minlength=3).astype(np.int64)
    after = dataset.state_dict(state)["datasets"]
    assert [e["row_offset"] for e in after] == (offsets + taken).tolist()
    assert [e["token_offset"] for e in after] == final
    assert (offsets + taken)[:2].min() > INT32_MAX and (offsets + taken)[1] > 2**32  # past both
