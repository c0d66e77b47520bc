"""Alike children planned as one stack: every row planned exactly as its child alone plans it, and
one program whatever the number of children (a mixture of 4 and of 64 compiles the same programs,
of the same size, but for the token-balanced selection's tree)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from corpora import random_docs, sliding_frames, write_docs
from meshes import mesh_of

from meshbatch import CausalLMDataset, Mixture, Pipeline, ShuffleSpec, TokenBalancedMixture
from meshbatch.arguments import as_key
from meshbatch.cache import TokenCache
from meshbatch.datasets import Rows
from meshbatch.datasets.mixtures import derive_keys
from meshbatch.kernels import Counts, select_tournament
from meshbatch.kernels.shuffles.permutation import SMALL
from meshbatch.pipeline.programs import plan_program

SEQ = 8
KEY = 11
SOURCES = 64


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """64 small caches of different lengths (so the stacked lengths differ); tokens say the cache."""
    root = tmp_path_factory.mktemp("stacks")
    rng = np.random.default_rng(7)
    return [
        TokenCache.open(
            write_docs(
                root / f"c{k}",
                random_docs(rng, rng.integers(3, 12), (2, 99), (3, 40), offset=100 * (k + 1), eos=1),
            )
        )
        for k in range(SOURCES)
    ]


SPECS = {
    "full": ShuffleSpec("full"),
    "full-epochs": ShuffleSpec("full", reshuffle_each_epoch=True),
    "full-levanter": ShuffleSpec("full", compat="levanter"),
    "linear": ShuffleSpec("full", kind="linear", reshuffle_each_epoch=True),
    "linear-levanter": ShuffleSpec("full", kind="linear", compat="levanter"),
    "era": ShuffleSpec("era", era_length=5, reshuffle_each_epoch=True),
    "block": ShuffleSpec("block", io_block_size=3, window_blocks=2),
    "block-epochs": ShuffleSpec("block", io_block_size=2, window_blocks=3, reshuffle_each_epoch=True),
    "era-levanter": ShuffleSpec("era", era_length=4, compat="levanter"),
    "block-levanter-epochs": ShuffleSpec(
        "block", io_block_size=4, compat="levanter", reshuffle_each_epoch=True
    ),
    "none": ShuffleSpec("none"),
}


@pytest.mark.parametrize("spec", list(SPECS.values()), ids=list(SPECS))
def test_stacked_rows_plan_as_each_child_alone(caches, spec):
    """Six alike children are one stack; every row of two epochs of the mixture is planned as the
    child's own device half (made alone, for its own key) plans that child row."""
    kids = {f"s{k}": CausalLMDataset(cache, SEQ, shuffle=spec) for k, cache in enumerate(caches[:6])}
    mixture = Mixture(kids, {name: 1.0 + k for k, name in enumerate(kids)}, block_size=12)
    device = mixture.make(as_key(KEY))[0]
    assert device.members == (tuple(range(6)),)
    if spec.strategy in ("full", "block"):  # the stack's short orders are tables (each child's walks)
        shuffle = device.stacks[0].shuffle
        order = shuffle.order if spec.strategy == "full" else shuffle.block_order
        assert order.shape == (6, SMALL)
    _, child_keys = derive_keys(as_key(KEY), list(kids))
    stream = np.arange(240)  # the children wrap many times: child epochs up to about 20
    rows = Rows(jnp.asarray(np.tile(stream, 2), jnp.uint32), jnp.asarray(np.repeat([0, 1], 240), jnp.uint32))
    plan, _ = plan_program(device, rows, None)
    source = np.asarray(plan.source)
    assert sorted(set(source.tolist())) == list(range(6))
    for c, (name, kid) in enumerate(kids.items()):
        mine = source == c
        child_plan = plan.detail.of(c)
        child_rows = Rows(
            *(jnp.asarray(np.asarray(x)[mine]) for x in (child_plan.rows.position, child_plan.rows.epoch))
        )
        alone, _ = kid.make(child_keys[name])[0].plan(child_rows)
        np.testing.assert_array_equal(
            np.asarray(child_plan.example)[mine], np.asarray(alone.example), err_msg=name
        )


BLOCK = ShuffleSpec("block", io_block_size=4)


def stable(caches, sources: int):
    kids = {f"s{k}": CausalLMDataset(caches[k], SEQ, shuffle=BLOCK, eos_id=1) for k in range(sources)}
    return Mixture(kids, {name: 1.0 for name in kids}, block_size=64)


def balanced(caches, sources: int):
    kids = {f"s{k}": CausalLMDataset(caches[k], SEQ, shuffle=BLOCK, eos_id=1) for k in range(sources)}
    return TokenBalancedMixture(kids)


def plan_size(dataset) -> int:
    """Lines of the plan program's jaxpr (its size, whatever the table shapes)."""
    device = dataset.make(as_key(KEY))[0]
    rows = Rows(jnp.arange(16, dtype=jnp.uint32), jnp.zeros(16, jnp.uint32))
    jaxpr = jax.make_jaxpr(lambda d, r, s: d.plan(r, s))(device, rows, dataset.init_state())
    return len(str(jaxpr).splitlines())


def count_first_batches(kind: str, paths: list[str]) -> dict[int, int]:
    """Programs compiled (or read from the persistent cache) for the first batch of a mixture of
    3 (warming up what any size shares), then 4 and 64 children, in this fresh process."""
    from compiles import count_compiles

    caches = [TokenCache.open(p) for p in paths]
    make = stable if kind == "stable" else balanced

    def first_batch(sources: int):  # no warm-up: every compile on this thread
        dataset = make(caches, sources)
        pipeline = Pipeline(dataset, mesh=mesh_of(8), batch_size=16, key=KEY, warmup=False)
        return jax.block_until_ready(pipeline.batch(0))

    first_batch(3)
    counts = {}
    for sources in (4, SOURCES):
        with count_compiles(this_thread=True) as compiles:
            batch = first_batch(sources)
        counts[sources] = len(compiles)
        assert set(np.unique(np.asarray(batch.tokens) // 100).tolist()) - {0} <= set(range(1, sources + 1))
    return counts


@pytest.mark.parametrize("make", [stable, balanced], ids=["stable", "token-balanced"])
def test_4_and_64_alike_children_compile_the_same_programs(caches, make):
    """A first batch of a mixture of 4 and of 64 block-shuffled causal children (8 devices): the
    same number of programs compiled (or read from the persistent cache), counted in a fresh
    process (a test worker's in-memory caches already hold some shapes); and a plan program of the
    same size, but for the token-balanced selection's tree."""
    kind = "stable" if make is stable else "balanced"
    here = os.path.dirname(__file__)  # the child imports this module, and it the shared helpers
    path = [here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    script = (
        "import json, sys, test_mixture_stacks as t; "
        f"print('RESULT', json.dumps(t.count_first_batches({kind!r}, sys.argv[1:])))"
    )
    paths = [cache.path for cache in caches]
    done = subprocess.run(
        [sys.executable, "-c", script, *paths], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    counts = json.loads(
        next(r for r in done.stdout.splitlines() if r.startswith("RESULT "))[len("RESULT ") :]
    )
    assert counts["4"] == counts[str(SOURCES)] >= 1, counts
    # the plan is the same program but for the token-balanced selection's tournament tree, which
    # climbs log2(sources) levels in straight-line code (interleave_tree.py)
    tree = selection_size(SOURCES) - selection_size(4) if make is balanced else 0
    assert plan_size(make(caches, SOURCES)) - plan_size(make(caches, 4)) == tree


def selection_size(sources: int) -> int:
    """Lines of the token-balanced selection's jaxpr at 16 rows."""
    zeros = jnp.zeros(sources, jnp.uint32)
    table = jnp.zeros((16, sources), jnp.int32)
    return len(str(jax.make_jaxpr(select_tournament)(Counts(zeros, zeros), table, zeros)).splitlines())


def test_a_mixture_with_unlike_children_stacks_the_alike_ones(caches):
    """Children of two shuffles and a splice child: the alike ones stack, the others stand alone,
    and the batches are the rows each child makes alone."""
    spec = ShuffleSpec("full")
    kids = {
        "a": CausalLMDataset(caches[0], SEQ, shuffle=spec, eos_id=1),
        "b": CausalLMDataset(caches[1], SEQ, shuffle=ShuffleSpec("none"), eos_id=1),
        "c": CausalLMDataset(caches[2], SEQ, shuffle=spec, eos_id=1),
        "d": sliding_frames(caches[3], SEQ, 5, eos=1),
        "e": CausalLMDataset(caches[4], SEQ, shuffle=spec, eos_id=1),
    }
    mixture = Mixture(kids, {name: 1.0 for name in kids}, block_size=10)
    device = mixture.make(as_key(KEY))[0]
    assert device.members == ((0, 2, 4), (1,), (3,))
    pipeline = Pipeline(mixture, mesh=mesh_of(8), batch_size=16, key=KEY)
    for step in range(3):
        tokens = np.asarray(pipeline.batch(step).tokens)
        plan, _ = plan_program(device, Rows(*pipeline._rows(step, np.arange(16))), None)
        source = np.asarray(plan.source)
        for c, name in enumerate(kids):
            if name == "d":
                continue
            mine = source == c
            example = np.asarray(plan.detail.of(c).example)[mine].astype(np.int64)
            cache = kids[name].source
            flat = np.concatenate(cache.read_rows(np.arange(cache.num_rows)))
            want = flat[example[:, None] * SEQ + np.arange(SEQ)]
            np.testing.assert_array_equal(tokens[mine], want, err_msg=f"{step=} {name=}")
        assert (tokens[source == 3] // 100 == 4).any()  # the splice child's frames (cache 3's ids)
