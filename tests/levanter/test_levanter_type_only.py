"""Issue 34, must-show 3: Levanter-shaped ``data:`` blocks with only ``type:`` added give exactly
Levanter's batches (Levanter's orders are the drop-in's default): a flat URL block unshuffled,
shuffled (both permutation types) and era-shuffled, with ``epoch: 2`` across the epoch boundary;
a flat Hugging Face ``id:`` block (a local directory ``datasets`` reads: nothing downloaded); a
mixture with a validation-only component at weight 0, era-shuffled and unshuffled, its validation
sets too.

Levanter's batches come from its own config's ``train_set`` (``get_batch``, as its
``DataLoader`` calls it); meshbatch's through ``PipelineLoader`` (the fast path) and
``get_batch`` (Levanter's ``DataLoader`` path). Training runs that compare losses:
tests/levanter/test_levanter_blocks.py and test_resume_order.py.
"""

import asyncio
import json
import shutil
import textwrap

import draccus
import haliax as hax
import jax
import numpy as np
import pytest
from levanter.data.text import HfSingleDatasetLMConfig, LMMixtureDatasetConfig, UrlSingleDatasetLMConfig
from levanter.schedule import BatchSchedule

from meshbatch.cache import ByteTokenizer
from meshbatch.levanter import PipelineLoader
from meshbatch.levanter.train_lm import TrainLmConfig

SEQ, BATCH, STEPS = 32, 4, 3
Pos = hax.Axis("position", SEQ)
KEY = jax.random.PRNGKey(7)
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]

URL = "tokenizer: {root}/tok\ncache_dir: {root}/cache/url\ntrain_urls: [{root}/web.jsonl]\n"
HF = "tokenizer: {root}/tok\ncache_dir: {root}/cache/hf\nid: {root}/hf\n"
MIXTURE = """\
tokenizer: {root}/tok
cache_dir: {root}/cache/mix
configs:
  web: {{train_urls: ["{root}/web.jsonl"], validation_urls: ["{root}/val.jsonl"]}}
  heldout: {{validation_urls: ["{root}/val.jsonl"]}}
  code: {{train_urls: ["{root}/code.jsonl"]}}
train_weights: {{web: 0.7, heldout: 0.0, code: 0.3}}
mixture_block_size: 8
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("typeonly")
    rng = np.random.default_rng(0)
    for name, docs in (("web", 30), ("code", 20), ("val", 6)):
        with open(root / f"{name}.jsonl", "w") as f:
            for n in rng.integers(5, 60, docs):
                f.write(json.dumps({"text": f"{name} " + " ".join(rng.choice(WORDS, n))}) + "\n")
    (root / "hf").mkdir()
    shutil.copy(root / "web.jsonl", root / "hf" / "train.jsonl")  # a local dataset directory
    ByteTokenizer().save_pretrained(str(root / "tok"))
    return root


def parse(root, data: str):
    path = root / "cfg.yaml"
    path.write_text("data:\n" + textwrap.indent(data.format(root=root), "  "))
    return draccus.parse(TrainLmConfig, config_path=str(path), args=[]).data


def pair(root, block: str, kind: str, shuffle: str = "", levanter_class=None):
    """Levanter's config of ``block`` and meshbatch's (``block`` plus only ``type:``); meshbatch
    builds the caches in process first (Levanter's own build would start Ray)."""
    ours = parse(root, f"type: {kind}\n" + block + shuffle)
    theirs = parse(root, block + shuffle)
    assert type(theirs) is levanter_class, type(theirs)
    if hasattr(ours, "caches"):
        ours.caches("train"), ours.caches("validation")
    else:
        ours.cache("train")
    return theirs, ours


def tokens(rows) -> np.ndarray:
    return np.stack([np.asarray(row.tokens.array) for row in rows])


def levanter_rows(dataset, indices) -> np.ndarray:
    with jax.numpy_dtype_promotion("standard"):  # Levanter's examples need JAX's standard promotion
        return tokens(asyncio.run(dataset.get_batch(list(indices))))


def assert_levanters(theirs, ours, what: str, *, epochs=None, indices=None) -> None:
    """The first ``STEPS`` batches (or rows ``indices``) of both train sets, equal."""
    want_set = theirs.train_set(Pos, BatchSchedule(BATCH), False, key=KEY, epochs=epochs)
    dataset = ours.train_set(Pos, BatchSchedule(BATCH), False, key=KEY, epochs=epochs)
    indices = list(range(STEPS * BATCH)) if indices is None else list(indices)
    want = levanter_rows(want_set, indices)
    got = tokens(asyncio.run(dataset.get_batch(indices)))  # the DataLoader path
    np.testing.assert_array_equal(got, want, err_msg=f"{what}: get_batch")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    loader = PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=BATCH)
    first, steps = indices[0] // BATCH, len(indices) // BATCH
    stream = loader.iter_from_step(first)
    for step in range(steps):  # the fast path
        np.testing.assert_array_equal(
            np.asarray(next(stream).tokens.array),
            want[step * BATCH : (step + 1) * BATCH],
            err_msg=f"{what}: fast path step {first + step}",
        )
    stream.close()


@pytest.mark.parametrize(
    "shuffle", ["", "shuffle: true\n", "shuffle: true\npermutation_type: feistel\n", "shuffle: 5\n"]
)
def test_a_flat_url_block_with_type_gives_levanters_batches(root, shuffle):
    theirs, ours = pair(root, URL, "causal_lm", shuffle, UrlSingleDatasetLMConfig)
    assert_levanters(theirs, ours, f"url {shuffle!r}")


@pytest.mark.parametrize("shuffle", ["shuffle: true\n", "shuffle: 5\n"])
def test_epochs_give_levanters_batches_across_the_epoch_boundary(root, shuffle):
    """``epoch: 2`` (Levanter's ``EpochDataset``): the second epoch in the first's order."""
    theirs, ours = pair(root, URL, "causal_lm", shuffle, UrlSingleDatasetLMConfig)
    n = ours.train_set(Pos, None, key=KEY, epochs=2).num_examples
    start = (n // BATCH - 1) * BATCH  # the last full batch of epoch 0, then into epoch 1
    assert_levanters(theirs, ours, f"epochs {shuffle!r}", epochs=2, indices=range(start, start + 3 * BATCH))


def test_a_flat_hf_block_with_type_gives_levanters_batches(root):
    theirs, ours = pair(root, HF, "hf_causal_lm", "shuffle: true\n", HfSingleDatasetLMConfig)
    assert_levanters(theirs, ours, "hf")


@pytest.mark.parametrize("shuffle", ["shuffle: 3\n", "shuffle: false\n"])
def test_a_mixture_with_a_validation_only_component_gives_levanters_batches(root, shuffle):
    """``heldout`` has validation data only, at weight 0: not built for train (as Levanter), yet
    an eval set, as ``web``'s; the train batches (era-shuffled components, or unshuffled: Levanter's
    mixture rows over each component in cache order) and the validation sets equal Levanter's."""
    theirs, ours = pair(root, MIXTURE, "stable_mixture", shuffle, LMMixtureDatasetConfig)
    assert ours.mixture(SEQ, batch_size=BATCH).names == ["web", "code"]
    assert_levanters(theirs, ours, f"mixture {shuffle!r}")
    want, got = theirs.validation_sets(Pos), ours.validation_sets(Pos)
    assert list(got) == list(want) == ["web", "heldout"]
    for name, dataset in got.items():
        n = len(want[name].as_sync_dataset())
        assert len(dataset.as_sync_dataset()) == n
        mine = tokens(asyncio.run(dataset.get_batch(list(range(n)))))
        np.testing.assert_array_equal(mine, levanter_rows(want[name], range(n)), err_msg=name)
