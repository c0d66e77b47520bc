"""Levanter-exact mixtures (``compat: levanter`` + ``mixture_compat: levanter``): the same
``data:`` block with and without ``type: stable_mixture`` gives the same batches, Levanter's
through its own ``LMMixtureDatasetConfig`` / ``MixtureDataset`` and ``DataLoader``, meshbatch's
through ``PipelineLoader`` (the fast path) and ``get_batch`` (the DataLoader path).

The components are ``a``, ``z`` and ``b`` in that order, ``z`` at weight 0 (never built for
train, so it takes no key: Levanter hands keys to the built components in order), for
``shuffle`` false, true and an era length, under both permutation types; and staged weights in
which ``z`` is 0 in every stage and ``b`` is absent from the first (Levanter accepts both).
"""

import asyncio
import json
import textwrap

import draccus
import haliax as hax
import jax
import numpy as np
import pytest
from levanter.data.text import LMMixtureDatasetConfig
from levanter.schedule import BatchSchedule

from meshbatch.cache import ByteTokenizer
from meshbatch.levanter import PipelineLoader, StableMixtureLMConfig
from meshbatch.levanter.train_lm import TrainLmConfig

SEQ, BATCH, STEPS = 32, 4, 4
Pos = hax.Axis("position", SEQ)

BLOCK = """\
{type}
tokenizer: {root}/tok
cache_dir: {root}/cache
configs:
  a: {{train_urls: ["{root}/a.jsonl"]}}
  z: {{train_urls: ["{root}/z.jsonl"]}}
  b: {{train_urls: ["{root}/b.jsonl"]}}
train_weights: {weights}
mixture_block_size: 8
shuffle: {shuffle}
{extra}
"""
OURS = "compat: levanter\nmixture_compat: levanter\n"
CONSTANT = "{a: 0.6, z: 0.0, b: 0.4}"
STAGED = "[[0, {a: 1.0, z: 0.0}], [2, {a: 0.25, z: 0.0, b: 0.75}]]"  # step 2 = row 8, a block


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixcompat")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    for name, docs in (("a", 30), ("z", 10), ("b", 20)):
        with open(root / f"{name}.jsonl", "w") as f:
            for n in rng.integers(5, 80, docs):
                f.write(json.dumps({"text": " ".join(rng.choice(words, n))}) + "\n")
    ByteTokenizer().save_pretrained(str(root / "tok"))
    # meshbatch builds the caches in process (Levanter's writer); Levanter's config then loads
    # them (its own build would start Ray)
    assert sorted(configs(root, "false")[1].caches("train")) == ["a", "b"]
    return root


def parse(root, data: str):
    path = root / "cfg.yaml"
    path.write_text("data:\n" + textwrap.indent(data, "  "))
    return draccus.parse(TrainLmConfig, config_path=str(path), args=[]).data


def configs(root, shuffle, permutation_type=None, weights=CONSTANT):
    """Levanter's config of the block and meshbatch's (the block plus ``type:`` and compat)."""
    extra = f"permutation_type: {permutation_type}\n" if permutation_type else ""
    block = dict(root=root, shuffle=shuffle, weights=weights)
    theirs = parse(root, BLOCK.format(type="", extra=extra, **block))
    ours = parse(root, BLOCK.format(type="type: stable_mixture", extra=extra + OURS, **block))
    assert type(theirs) is LMMixtureDatasetConfig and type(ours) is StableMixtureLMConfig
    return theirs, ours


def mesh():
    return jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))


def levanter_batches(config) -> list[np.ndarray]:
    """The first ``STEPS`` token batches of Levanter's own mixture (its ``get_batch``, as its
    ``DataLoader`` calls it; Levanter's examples need JAX's standard dtype promotion)."""
    dataset = config.train_set(Pos, BatchSchedule(BATCH), False, key=jax.random.PRNGKey(0))
    with jax.numpy_dtype_promotion("standard"):
        rows = asyncio.run(dataset.get_batch(list(range(STEPS * BATCH))))
    tokens = np.stack([np.asarray(row.tokens.array) for row in rows])
    return list(tokens.reshape(STEPS, BATCH, SEQ))


def assert_equal_to_levanter(theirs, ours, what: str) -> None:
    want = levanter_batches(theirs)
    dataset = ours.train_set(Pos, BatchSchedule(BATCH), False, key=jax.random.PRNGKey(0))
    loader = PipelineLoader(dataset, mesh=mesh(), axis_mapping={"batch": "data"}, batch_size=BATCH)
    for step, example in zip(range(STEPS), loader.iter_from_step(0), strict=False):
        np.testing.assert_array_equal(np.asarray(example.tokens.array), want[step], err_msg=f"{what} {step=}")
    rows = asyncio.run(dataset.get_batch(list(range(STEPS * BATCH))))  # the DataLoader path
    got = np.stack([np.asarray(row.tokens.array) for row in rows])
    np.testing.assert_array_equal(got, np.concatenate(want), err_msg=f"{what} get_batch")


@pytest.mark.parametrize(
    ("shuffle", "permutation_type"),
    [("false", None), ("true", "linear"), ("true", "feistel"), ("3", "linear"), ("3", "feistel")],
)
def test_shuffled_mixture_equals_levanter(root, shuffle, permutation_type):
    theirs, ours = configs(root, shuffle, permutation_type)
    assert_equal_to_levanter(theirs, ours, f"shuffle={shuffle} {permutation_type}")


def test_staged_weights_with_a_component_at_zero_equal_levanter(root):
    """``z`` is 0 in every stage (not built, as in Levanter) and ``b`` is absent from stage 0."""
    theirs, ours = configs(root, "true", "feistel", weights=STAGED)
    assert ours.mixture(SEQ, batch_size=BATCH).names == ["a", "b"]
    assert_equal_to_levanter(theirs, ours, "staged")


@pytest.mark.parametrize(("shuffle", "permutation_type"), [("true", "linear"), ("3", "feistel")])
def test_train_sets_are_levanters_components(root, shuffle, permutation_type):
    """``train_sets`` (Levanter's ``eval_lm --eval_on_train``) is each built component's shuffled
    windows, keyed as Levanter keys them: ``key_iterator(key)`` over ``a``, ``b``."""
    theirs, ours = configs(root, shuffle, permutation_type)
    key = jax.random.PRNGKey(5)
    want = theirs.train_sets(Pos, False, key=key)
    got = ours.train_sets(Pos, False, key=key)
    assert list(got) == list(want) == ["a", "b"]
    for name, dataset in got.items():
        with jax.numpy_dtype_promotion("standard"):
            rows = asyncio.run(want[name].get_batch(list(range(8))))
        mine = asyncio.run(dataset.get_batch(list(range(8))))
        np.testing.assert_array_equal(
            np.stack([np.asarray(r.tokens.array) for r in mine]),
            np.stack([np.asarray(r.tokens.array) for r in rows]),
            err_msg=name,
        )


@pytest.mark.parametrize("weights", ["{}", "{a: 0.0, b: 0.0}", "[[0, {a: 0.0}], [2, {b: 0.0}]]"])
def test_weights_with_nothing_to_train_fail_naming_them(root, weights):
    """Levanter fails too ("Datasets cannot be empty"); meshbatch names ``train_weights``
    before building anything."""
    theirs, ours = configs(root, "false", weights=weights)
    with pytest.raises(ValueError, match="cannot be empty"):
        theirs.train_set(Pos, BatchSchedule(BATCH), False, key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=r"train_weights=.* no component a positive weight"):
        ours.train_set(Pos, BatchSchedule(BATCH), False, key=jax.random.PRNGKey(0))


def test_a_weighted_component_without_train_data_is_refused_in_levanter_mode(root, caplog):
    """Levanter skips ``c`` (no train data, no cache) but keeps its weight in every block's total
    (here a: 6, b: 2 rows of 8 instead of 5 and 3); ``mixture_compat: levanter`` (the default)
    refuses to differ silently, ``mixture_compat: exact`` mixes the built ones and warns."""
    block = BLOCK.replace("  b: {", '  c: {{validation_urls: ["{root}/b.jsonl"]}}\n  b: {')
    data = dict(root=root, shuffle="false", weights="{a: 0.6, b: 0.4, c: 0.5}")
    for extra in (OURS, ""):  # Levanter's order: asked for, and the default
        ours = parse(root, block.format(type="type: stable_mixture", extra=extra, **data))
        with pytest.raises(ValueError, match=r"configs \['c'\] have a positive train weight"):
            ours.mixture(SEQ)
    exact = parse(root, block.format(type="type: stable_mixture", extra="mixture_compat: exact\n", **data))
    assert exact.mixture(SEQ).names == ["a", "b"] and "['c']" in caplog.text


def test_validation_sets_are_levanters(root):
    """Every component with validation data, ``z`` (weight 0) included, unshuffled, as Levanter's."""
    block = BLOCK.replace('z.jsonl"]}}', 'z.jsonl"], validation_urls: ["{root}/z.jsonl"]}}')
    block = block.replace('a.jsonl"]}}', 'a.jsonl"], validation_urls: ["{root}/b.jsonl"]}}')
    data = dict(root=root, shuffle="true", weights=CONSTANT)
    ours = parse(root, block.format(type="type: stable_mixture", extra=OURS, **data))
    got = ours.validation_sets(Pos)  # builds the validation caches in process
    want = parse(root, block.format(type="", extra="", **data)).validation_sets(Pos)
    assert list(got) == list(want) == ["a", "z"]
    for name, dataset in got.items():
        with jax.numpy_dtype_promotion("standard"):
            n = len(want[name].as_sync_dataset())
            rows = asyncio.run(want[name].get_batch(list(range(n))))
        assert len(dataset.as_sync_dataset()) == n
        mine = asyncio.run(dataset.get_batch(list(range(n))))
        for leaf in ("tokens", "loss_mask"):
            np.testing.assert_array_equal(
                np.stack([np.asarray(getattr(r, leaf).array) for r in mine]),
                np.stack([np.asarray(getattr(r, leaf).array) for r in rows]),
                err_msg=f"{name} {leaf}",
            )
