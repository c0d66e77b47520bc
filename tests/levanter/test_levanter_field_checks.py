"""Every field is honoured or refused naming its value, at parse time (review findings 4, 5, 6,
11, 13): order fields reach ``ShuffleSpec``, a splice config's base and top-level fields agree or
fail, a chat base is refused, ``base.max_train_batches`` bounds the training subset, and
``metrics_every`` / ``eos_id`` / ``cache_dir`` are checked when the YAML is parsed."""

import json
import re
import shutil
import textwrap

import draccus
import haliax as hax
import numpy as np
import pytest
from corpora import text_root

from meshbatch.datasets.splice.selection import select_documents
from meshbatch.levanter.train_lm import TrainLmConfig
from meshbatch.shuffles.shuffle_spec import ShuffleSpec


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = text_root(
        tmp_path_factory.mktemp("field_checks"), 0, (5, 60, 30), ["ab", "cd", "ef"], numbered=True
    )
    shutil.copytree(root / "tok", root / "tok_noeos")  # the same without the post-processor's EOS
    spec = json.loads((root / "tok" / "tokenizer.json").read_text())
    (root / "tok_noeos" / "tokenizer.json").write_text(json.dumps({**spec, "post_processor": None}))
    return root


def parse(root, data: str):
    path = root / "cfg.yaml"
    path.write_text("data:\n" + textwrap.indent(textwrap.dedent(data).format(root=root), "  "))
    return draccus.parse(TrainLmConfig, config_path=str(path), args=[]).data


CAUSAL = "type: causal_lm\ntokenizer: {root}/tok\ncache_dir: {root}/c\ntrain_urls: [{root}/train.jsonl]\n"
MIXTURE = (
    "type: stable_mixture\ntokenizer: {root}/tok\ncache_dir: null\n"
    "configs:\n  a: {{cache_dir: {root}/a, train_urls: [{root}/train.jsonl]}}\n"
    "  b: {{train_urls: [{root}/train.jsonl]}}\ntrain_weights: {{a: 0.5, b: 0.5}}\n"
)
SPLICE = "type: splice_multi_document\ntokenizer: {root}/tok\nnum_docs: 2\ncontent_length: 8\n"
MIXED = MIXTURE.replace("cache_dir: null\n", "")
CHAT = ", format: {{type: chat}}"


def url_base(extra: str = "", cache: str = "s") -> str:
    return f"base: {{{{cache_dir: {{root}}/{cache}, train_urls: [{{root}}/train.jsonl]{extra}}}}}\n"


def mix_base(extra: str = "", cache: str = "s") -> str:
    return (
        "base:\n  type: mixture\n  configs:\n"
        f"    w: {{{{cache_dir: {{root}}/{cache}, train_urls: [{{root}}/train.jsonl]{extra}}}}}\n"
    )


REFUSED = [
    # finding 5: order fields reach ShuffleSpec (they were dropped unless shuffle: block / a shuffle)
    (CAUSAL + "shuffle: true\nio_block_size: 4096\n", "io_block_size=4096"),
    (CAUSAL + "shuffle: 16\nwindow_blocks: 3\n", "window_blocks=3"),
    (CAUSAL + "reshuffle_each_epoch: true\n", "reshuffle_each_epoch=True"),
    # finding 13
    (CAUSAL + "metrics_every: -5\n", "metrics_every=-5"),
    (CAUSAL + "eos_id: -3\n", "eos_id=-3"),
    (CAUSAL + "eos_id: 7\nformat: {{type: supervised}}\n", "eos_id=7 with format=SupervisedLmDatasetFormat"),
    (CAUSAL + "cache_dir: null\n", "cache_dir=None"),
    (MIXTURE, r"configs\['b'\]\.cache_dir=None with cache_dir=None"),
    (SPLICE + url_base().replace("{root}/s", "null"), "base.cache_dir=None"),
    # finding 6: a chat/supervised base is refused (its masks would be dropped)
    (SPLICE + url_base(CHAT), "base.format=ChatLmDatasetFormat"),
    (SPLICE + mix_base(", format: {{type: supervised}}"),
     r"base\.configs\['w'\]\.format=SupervisedLmDatasetFormat"),
    # finding 4: the splice's base and top-level fields are used or refused, never dropped
    (SPLICE + "enforce_eos: true\n" + url_base(", enforce_eos: false"),
     "base.enforce_eos=False differs from enforce_eos=True"),
    (SPLICE + url_base(", cache_options: {{batch_size: 7}}"),
     "base.cache_options=.*batch_size=7.* differs from cache_options"),
    (SPLICE + mix_base() + "  shuffle_per_epoch: true\n",
     "base.shuffle_per_epoch=True differs from shuffle_per_epoch=False"),
    (SPLICE + "ignore_token_id: 97\n", "ignore_token_id=97 is refused by splice"),
    (SPLICE + "eos_id: 97\n", "eos_id=97 is refused by splice"),
    (SPLICE + "chat_template: x\n", "chat_template='x' is refused by splice"),
    (SPLICE + url_base(", ignore_token_id: 3"), "ignore_token_id=3 is refused by splice base"),
    (SPLICE + url_base(", validation_urls: [v]"), "validation_urls=.*v.* is refused by splice base"),
    (SPLICE + mix_base(", validation_urls: [v]"), r"base.configs\['w'\].validation_urls="),
    (MIXED + "shuffle_per_epoch: false\n", "shuffle_per_epoch=False is refused by stable_mixture"),
    (MIXED + "chat_template: x\n", "chat_template='x' is refused by stable_mixture"),
    # finding 11: base.max_train_batches bounds the training subset, which must be asked for
    (SPLICE + mix_base() + "  max_train_batches: {{w: 2}}\n",
     r"base.max_train_batches=\{'w': 2\} bounds the training subset"),
    (SPLICE + "restrict_to_training_subset: true\nmax_train_batches: 2\n" + url_base(),
     "max_train_batches=2 needs initial_batch_size"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "named"), REFUSED, ids=[re.sub(r"\W+", "_", n)[:50] for _, n in REFUSED])
def test_a_field_that_cannot_be_honoured_fails_at_parse_time_naming_its_value(root, data, named):
    with pytest.raises(Exception, match=named):
        parse(root, data)


def test_levanter_drops_permutation_type_without_a_shuffle_and_so_do_we(root):
    config = parse(root, CAUSAL + "permutation_type: feistel\n")
    assert config.shuffle_spec() == ShuffleSpec("none")
    block = CAUSAL + "shuffle: block\nio_block_size: 64\nwindow_blocks: 3\n"
    assert parse(root, block).shuffle_spec() == (  # the default order: marin's block shuffle
        ShuffleSpec("block", io_block_size=64, window_blocks=3, compat="levanter")
    )
    assert parse(root, block + "compat: strong\n").shuffle_spec() == (
        ShuffleSpec("block", io_block_size=64, window_blocks=3)
    )


def test_splice_base_fields_equal_to_the_top_level_ones_are_used(root):
    """``enforce_eos`` on both levels builds the cache with it (Levanter's processor appends the
    EOS, 256, only when asked); the seed's ``shuffle_per_epoch: true`` on both reaches the schedule."""
    last = {}
    for eos in ("true", "false"):
        data = SPLICE.replace("/tok", "/tok_noeos") + f"enforce_eos: {eos}\n"
        config = parse(root, data + url_base(f", enforce_eos: {eos}", cache=f"eos_{eos}"))
        last[eos] = int(config.cache().read_rows(np.arange(1))[0][-1])
    assert last["true"] == 256 and last["false"] != 256
    both = SPLICE + "shuffle_per_epoch: true\n" + mix_base() + "  shuffle_per_epoch: true\n"
    assert parse(root, both).spec(64).shuffle_per_epoch is True


def test_base_max_train_batches_bounds_the_training_subset(root):
    """A mixture base's ``max_train_batches[dataset_name]`` (Levanter's field) is the training
    subset of ``restrict_to_training_subset`` when the splice config sets none."""
    config = parse(  # the bound: 4 batches x 2 rows x 64 tokens
        root,
        SPLICE.replace("num_docs: 2", "num_docs: 3")
        + "restrict_to_training_subset: true\ninitial_batch_size: 2\n"
        "doc_select_mode: longest\n" + mix_base() + "  max_train_batches: {{w: 4}}\n",
    )
    cache = config.cache()
    want = select_documents(
        cache.doc_lengths(), num_docs=3, doc_select_mode="longest", restrict_to_training_subset=True,
        max_train_batches=4, initial_batch_size=2, seq_len=64,
    )  # fmt: skip
    assert list(config.selected(cache, 64).indices) == list(want.indices)
    everywhere = select_documents(cache.doc_lengths(), num_docs=3, doc_select_mode="longest")
    assert list(want.indices) != list(everywhere.indices)  # the bound changes the selection


def test_a_flat_hf_block_switches_with_one_type_line(root):
    """Levanter's ``HfSingleDatasetLMConfig`` (``id:``) with ``type: hf_causal_lm``: its cache is
    built by Levanter's ``WrappedHFDataSource`` (here a local directory ``datasets`` reads, nothing
    downloaded) and holds the same documents as the ``causal_lm`` cache of the same JSONL."""
    (root / "hf").mkdir(exist_ok=True)
    shutil.copy(root / "train.jsonl", root / "hf" / "train.jsonl")
    hf = parse(root, "type: hf_causal_lm\ntokenizer: {root}/tok\ncache_dir: {root}/hfc\nid: {root}/hf\n")
    urls = parse(root, CAUSAL)
    rows = np.arange(30)
    got, want = hf.cache().read_rows(rows), urls.cache().read_rows(rows)
    assert [list(map(int, d)) for d in got] == [list(map(int, d)) for d in want]
    assert hf.validation_sets(hax.Axis("position", 16)) == {}  # no validation split in the directory
    batch = hf.train_set(hax.Axis("position", 16), None, key=0).batch(np.arange(2))
    assert np.asarray(batch.tokens).shape == (2, 16)
    with pytest.raises(Exception, match="quick_start=True is refused by hf_causal_lm"):
        parse(root, "type: hf_causal_lm\nid: {root}/hf\nshuffle: era\nera_length: 4\nquick_start: true\n")
