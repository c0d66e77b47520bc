"""Levanter data configs: the seed's YAML examples parse (local paths), every field group reaches
the dataset, Levanter's own YAML still parses, bad configs fail naming the field, and the byte
tokenizer directory gives Levanter and meshbatch the same tokens."""

import dataclasses
import textwrap
import time

import draccus
import haliax as hax
import jax
import numpy as np
import pytest
from corpora import text_root, word_texts, write_jsonl
from levanter.data.text import LMMixtureDatasetConfig, UrlSingleDatasetLMConfig

from meshbatch import Mixture, Pipeline, ShuffleSpec, TokenBalancedMixture
from meshbatch.cache import ByteTokenizer, HFTokenizer
from meshbatch.cache.format.ledger import try_read_ledger
from meshbatch.datasets.splice.selection import select_documents
from meshbatch.datasets.splice.splice_spec import SpliceSpec
from meshbatch.levanter import (
    CausalLMConfig,
    MixtureBaseConfig,
    PipelineLoader,
    SpliceMultiDocumentLMConfig,
    SpliceSingleDocumentLMConfig,
    StableMixtureLMConfig,
    TokenBalancedMixtureLMConfig,
)
from meshbatch.levanter.mixture_config import LevanterKeyedMixture
from meshbatch.levanter.train_lm import TrainLmConfig

SEQ = 64
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return text_root(tmp_path_factory.mktemp("configs"), 0, (5, 120, 40), WORDS)


def parse(root, data: str) -> TrainLmConfig:
    path = root / "cfg.yaml"
    path.write_text("data:\n" + textwrap.indent(textwrap.dedent(data), "  "))
    return draccus.parse(TrainLmConfig, config_path=str(path), args=[])


SEED_MULTI = """\
type: splice_multi_document
tokenizer: {root}/tok
base:
  type: mixture
  tokenizer: {root}/tok
  configs:
    common_pile/wikimedia:
      cache_dir: {root}/cache/wikimedia
      train_urls: [{root}/train.jsonl]
      format: {{text_key: text}}
  train_weights: {{common_pile/wikimedia: 1.0}}
  shuffle: false
  shuffle_per_epoch: true
dataset_name: common_pile/wikimedia
num_docs: 10
min_doc_length: 100
max_doc_length: 500
doc_select_mode: longest
content_length: 40
content_stride: 1
content_start_mode: coverage_balanced
min_copy_len: 8
alpha: 0.8
balance_mode: by_temperature
balance_tau: 0.7
offset_jitter: 2
adaptive_k: true
shuffle_per_epoch: true
"""

SEED_SINGLE = """\
type: splice_single_document
tokenizer: {root}/tok
base:
  type: url_single_dataset
  cache_dir: {root}/cache/single
  train_urls: [{root}/train.jsonl]
dataset_name: common_pile/wikimedia
doc_index: 7
offset_stride: 1
content_length: 3
content_stride: 1
content_start_mode: slide_within
mode: splice
restrict_to_training_subset: true
max_train_batches: 4
initial_batch_size: 8
"""


def test_seed_multi_document_yaml_reaches_the_dataset(root):
    config = parse(root, SEED_MULTI.format(root=root)).data
    assert isinstance(config, SpliceMultiDocumentLMConfig) and isinstance(config.base, MixtureBaseConfig)
    dataset = config.dataset(SEQ)
    # selection fields
    lengths = config.cache().doc_lengths()
    want = select_documents(
        lengths, num_docs=10, min_doc_length=100, max_doc_length=500, doc_select_mode="longest"
    )
    np.testing.assert_array_equal(dataset.doc_lengths, lengths[want.indices])
    # splice fields
    assert dataset.spec == SpliceSpec(
        seq_len=SEQ, content_length=40, content_stride=1, content_start_mode="coverage_balanced",
        min_copy_len=8, alpha=0.8, balance_mode="by_temperature", balance_tau=0.7, offset_jitter=2,
        adaptive_k=True, shuffle_per_epoch=True, pad_token_id=0,
    )  # fmt: skip


def test_seed_single_document_yaml_reaches_the_dataset(root):
    config = parse(root, SEED_SINGLE.format(root=root)).data
    assert isinstance(config, SpliceSingleDocumentLMConfig)
    assert config.component[0] == "common_pile/wikimedia"
    cache = config.cache()
    selection = config.selected(cache, SEQ)
    want = select_documents(
        cache.doc_lengths(), doc_index=7, restrict_to_training_subset=True, max_train_batches=4,
        initial_batch_size=8, seq_len=SEQ,
    )  # fmt: skip
    np.testing.assert_array_equal(selection.indices, want.indices)
    dataset = config.dataset(SEQ)
    assert (dataset.spec.content_length, dataset.spec.content_start_mode, dataset.spec.mode) == (
        3,
        "slide_within",
        "splice",
    )


def test_per_axis_shuffles_and_seeds_reach_the_schedule(root):
    """The seed's ``shuffle_offsets: bool|int`` / ``offset_seed`` (and the content axis's): an int
    is a window (Levanter's era length), a seed fixes that axis whatever the run's key."""
    extra = "shuffle_offsets: 4\noffset_seed: 11\nshuffle_content: true\ncontent_seed: 3\n"
    config = parse(root, SEED_SINGLE.format(root=root) + extra).data
    spec = config.dataset(SEQ).spec
    assert (spec.shuffle_offsets, spec.offset_seed, spec.shuffle_content, spec.content_seed) == (
        4,
        11,
        True,
        3,
    )
    assert spec.axis_shuffle("offsets") == (4, 11) and spec.axis_shuffle("content") == (0, 3)
    assert not spec.needs_key
    plain = parse(root, SEED_SINGLE.format(root=root) + "shuffle_offsets: true\n").data.dataset(SEQ).spec
    assert plain.shuffle_offsets is True and plain.axis_shuffle("offsets") == (0, None)


def test_causal_yaml_reaches_the_dataset(root):
    config = parse(
        root,
        f"""\
        type: causal_lm
        tokenizer: {root}/tok
        cache_dir: {root}/cache/causal
        train_urls: [{root}/train.jsonl]
        shuffle: era
        era_length: 16
        permutation_type: linear
        compat: levanter
        reshuffle_each_epoch: true
        eos_id: 256
        """,
    ).data
    assert isinstance(config, CausalLMConfig)
    dataset = config.dataset(SEQ)
    assert dataset.shuffle_spec == ShuffleSpec(
        "era", kind="linear", compat="levanter", era_length=16, reshuffle_each_epoch=True
    )
    assert dataset.seq_len == SEQ and dataset.eos_id == 256
    block = f"type: causal_lm\ntokenizer: {root}/tok\ncache_dir: {root}/cache/causal\nshuffle: block\n"
    assert parse(root, block).data.shuffle_spec() == ShuffleSpec("block", compat="levanter")
    strong = parse(root, block + "compat: strong\n").data  # meshbatch's order: one line away
    assert strong.shuffle_spec() == ShuffleSpec("block", window_blocks=8)


def test_levanter_yamls_still_parse(root):
    assert isinstance(parse(root, "tokenizer: gpt2\ntrain_urls: [a.jsonl]\n").data, UrlSingleDatasetLMConfig)
    mixture = "configs: {a: {train_urls: [a.jsonl]}}\ntrain_weights: {a: 1.0}\n"
    assert isinstance(parse(root, mixture).data, LMMixtureDatasetConfig)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ("type: splice_multi_document\ncontent_start_mode: nonsense\n", "content_start_mode"),
        ("type: splice_multi_document\nalpah: 0.8\n", "alpah"),
        ("type: no_such_type\n", "no_such_type"),
        ("type: causal_lm\nshuffle: sideways\n", "shuffle"),
        ("type: causal_lm\nshuffle: block\nera_length: 4\n", "era_length"),
        ("type: causal_lm\nshuffle: block\nquick_start: true\n", "quick_start"),
        ("type: causal_lm\nshuffle: none\nquick_start: true\nfast_path: false\n", "fast_path"),
        ("type: splice_multi_document\nvalidation_starts: 0\n", "validation_starts"),
        ("type: splice_multi_document\ncontent_length: 1\n", "content_length"),
        ("type: splice_single_document\nnum_docs: 3\n", "num_docs"),
        ("type: splice_multi_document\ncontent_start_mode: slide_within\noffset_seed: 3\n", "offset_seed"),
        (
            "type: splice_multi_document\ncontent_start_mode: slide_within\nshuffle_offsets: 1\n",
            "shuffle_offsets",
        ),
        ("type: splice_multi_document\ntokenizer: passthrough\n", "tokenizer"),
        ("type: splice_multi_document\nbase: {type: mixture, configs: {a: {}, b: {}}}\n", "dataset_name"),
        (
            "type: splice_multi_document\nbase: {type: mixture, configs: {a: {}}}\ndataset_name: z\n",
            "dataset_name",
        ),
        (
            "type: splice_multi_document\nbase: {type: mixture, configs: {a: {}}, train_weights: {b: 1.0}}\n",
            "train_weights",
        ),
    ],
)
def test_bad_configs_fail_naming_the_field(root, data, named):
    with pytest.raises(Exception, match=named):
        parse(root, data)


def test_byte_tokenizer_directory_matches_for_levanter_and_meshbatch(root):
    config = parse(root, f"type: causal_lm\ntokenizer: {root}/tok\ncache_dir: {root}/cache/t\n").data
    texts = ["héllo wörld\n\tx", "a  b", ""]
    levanter_ids = [config.the_tokenizer(t)["input_ids"] for t in texts]
    ours = [list(map(int, ids)) for ids in ByteTokenizer().encode_batch(texts)]
    assert levanter_ids == ours
    assert [
        list(map(int, ids)) for ids in HFTokenizer(f"{root}/tok/tokenizer.json").encode_batch(texts)
    ] == ours
    assert len(config.the_tokenizer) == 257


def test_dataclass_fields_cover_the_splice_spec():
    """Every SpliceSpec field (but seq_len, the model's) is a config field of the splice configs."""
    spec_fields = {f.name for f in dataclasses.fields(SpliceSpec)} - {"seq_len"}
    assert spec_fields <= {f.name for f in dataclasses.fields(SpliceMultiDocumentLMConfig)}


MIXTURE = """\
type: {type}
tokenizer: {root}/tok
configs:
  web: {{cache_dir: {root}/cache/web, train_urls: [{root}/train.jsonl]}}
  code:
    cache_dir: {root}/cache/code
    train_urls: [{root}/train.jsonl]
    validation_urls: [{root}/train.jsonl]
train_weights: {weights}
shuffle: era
era_length: 8
permutation_type: feistel  # Levanter's default is linear
eos_id: 256
"""


def test_stable_mixture_yaml_reaches_the_mixture(root):
    """meshbatch's own orders, asked for (``compat: strong``, ``mixture_compat: exact``), reach
    ``Mixture``; without them the mixture and its components are Levanter's."""
    staged = "[[0, {web: 0.7, code: 0.3}], [4, {web: 0.2, code: 0.8}]]"
    block = MIXTURE.format(type="stable_mixture", root=root, weights=staged) + "mixture_block_size: 16\n"
    default = parse(root, block).data.mixture(SEQ, batch_size=4)
    assert type(default) is LevanterKeyedMixture and default.compat == "levanter"
    assert all(child.shuffle_spec.compat == "levanter" for child in default.children)
    config = parse(root, block + "compat: strong\nmixture_compat: exact\n").data
    assert isinstance(config, StableMixtureLMConfig)
    assert config.stages() == [(0, {"web": 0.7, "code": 0.3}), (4, {"web": 0.2, "code": 0.8})]
    mixture = config.mixture(SEQ, batch_size=4)
    assert mixture.names == ["web", "code"] and mixture.block_size == 16
    assert all(child.shuffle_spec == ShuffleSpec("era", era_length=8) for child in mixture.children)
    want = Mixture(
        {name: child for name, child in zip(mixture.names, mixture.children, strict=True)},
        [(0, {"web": 0.7, "code": 0.3}), (4, {"web": 0.2, "code": 0.8})],
        block_size=16, batch_size=4,
    )  # fmt: skip
    rows = np.arange(64, dtype=np.uint32)
    key = jax.random.key(0)
    np.testing.assert_array_equal(
        np.asarray(mixture.make(key)[0].schedule.lookup(rows)[0]),
        np.asarray(want.make(key)[0].schedule.lookup(rows)[0]),
    )
    assert sorted(config.validation_sets(hax.Axis("position", SEQ))) == ["code"]


def test_token_balanced_mixture_trains_on_the_fast_path_only(root):
    data = MIXTURE.format(type="token_balanced_mixture", root=root, weights="{}") + "baseline: min\n"
    config = parse(root, data).data
    assert isinstance(config, TokenBalancedMixtureLMConfig)
    assert config.dataset(SEQ).baseline == "min"
    with pytest.raises(Exception, match="fast_path"):
        parse(root, data + "fast_path: false\n")
    Pos = hax.Axis("position", SEQ)
    dataset = config.train_set(Pos, None, key=jax.random.key(1))
    with pytest.raises(ValueError, match="stateful"):
        dataset.batch([0, 1])
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    loader = PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=4)
    stream = loader.iter_from_step(0)
    uninterrupted = [np.asarray(next(stream).tokens.array) for _ in range(4)]
    fresh = PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=4)
    resumed = np.asarray(next(fresh.iter_from_step(3)).tokens.array)  # replays steps 0..2's plans
    np.testing.assert_array_equal(resumed, uninterrupted[3])
    direct = Pipeline(
        TokenBalancedMixture(config.children(SEQ), baseline="min"), mesh=mesh, batch_size=4, key=dataset.key
    )
    np.testing.assert_array_equal(np.asarray(direct.batch(0).tokens), uninterrupted[0])


def test_mixture_configs_refuse_what_does_not_apply(root):
    for data, named in (
        (f"type: stable_mixture\ntokenizer: {root}/tok\n", "mixture"),
        ("type: stable_mixture\nconfigs: {a: {}}\ndataset_name: a\n", "dataset_name"),
        (
            "type: stable_mixture\nconfigs: {a: {}}\nmixture_block_size: 16\nstop_strategy: never\n",
            "stop_strategy",
        ),
    ):
        with pytest.raises(Exception, match=named):
            parse(root, data)


def test_quick_start_yaml_serves_batches_while_the_cache_is_built(tmp_path):
    """``quick_start: true``: ``train_set`` returns as soon as the background build's first ledger
    is written; the fast path's batches (committed windows only, waiting for more) equal those of
    the finished cache with the same key (the era shuffle allows it)."""
    rng = np.random.default_rng(1)
    # ~3 MB of bytes: 3 commits of 1 Mi tokens
    write_jsonl(tmp_path / "big.jsonl", word_texts(rng, rng.integers(200, 1200, 700), WORDS))
    ByteTokenizer().save_pretrained(str(tmp_path / "tok"))
    cache_dir = tmp_path / "cache"
    data = (
        f"type: causal_lm\ntokenizer: {tmp_path}/tok\n"
        f"cache_dir: {cache_dir}\ntrain_urls: [{tmp_path}/big.jsonl]\n"
        "shuffle: era\nera_length: 64\nquick_start: true\n"
    )
    Pos = hax.Axis("position", SEQ)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))

    def batches(config, steps=8):
        dataset = config.train_set(Pos, None, key=jax.random.key(3))
        loader = PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=8)
        stream = loader.iter_from_step(0)
        got = [np.asarray(next(stream).tokens.array) for _ in range(steps)]
        getattr(stream, "close", lambda: None)()
        return got

    early = batches(parse(tmp_path, data).data)
    deadline = time.monotonic() + 300
    while not getattr(try_read_ledger(str(cache_dir / "train")), "is_finished", False):
        assert time.monotonic() < deadline, "the background build did not finish"
        time.sleep(0.1)
    final = batches(parse(tmp_path, data.replace("quick_start: true\n", "")).data)
    for got, want in zip(early, final, strict=True):
        np.testing.assert_array_equal(got, want)
