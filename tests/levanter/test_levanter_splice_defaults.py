"""Issue 18, splice: a minimal config has the seed's defaults (10 documents, coverage_balanced,
by_temperature), ``doc_key`` is a field, and the seed's own YAML examples (local paths) make
batches, not only parse: the single-document one with ``restrict_to_training_subset: true`` and no
``max_train_batches`` reads the whole cache as the training subset."""

import textwrap

import draccus
import haliax as hax
import numpy as np
import pytest
from corpora import text_root

from meshbatch.levanter.train_lm import TrainLmConfig

SEQ = 64


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return text_root(
        tmp_path_factory.mktemp("splice_defaults"), 0, (20, 120, 30), ["ab", "cd", "ef"], numbered=True
    )


def parse(root, data: str):
    path = root / "cfg.yaml"
    path.write_text("data:\n" + textwrap.indent(textwrap.dedent(data), "  "))
    return draccus.parse(TrainLmConfig, config_path=str(path), args=[]).data


def test_minimal_splice_config_has_the_seed_defaults(root):
    config = parse(root, f"type: splice_multi_document\ntokenizer: {root}/tok\n"
                         f"base: {{cache_dir: {root}/c, train_urls: [{root}/train.jsonl]}}\n")  # fmt: skip
    assert (config.num_docs, config.content_start_mode, config.balance_mode) == (
        10, "coverage_balanced", "by_temperature")  # fmt: skip
    dataset = config.dataset(SEQ)
    assert len(dataset.doc_lengths) == 10 and dataset.spec.balance_mode == "by_temperature"


def test_doc_key_selects_by_text(root):
    config = parse(root, f"type: splice_single_document\ntokenizer: {root}/tok\ndoc_key: doc07\n"
                         f"base: {{cache_dir: {root}/c, train_urls: [{root}/train.jsonl]}}\n")  # fmt: skip
    selection = config.selected(config.cache(), SEQ)
    assert list(selection.indices) == [7]


SEED_SINGLE_EXACT = """\
type: splice_single_document
tokenizer: {root}/tok
base:
  type: url_single_dataset
  cache_dir: {root}/c
  train_urls: [{root}/train.jsonl]
dataset_name: common_pile/wikimedia
doc_index: 12
offset_stride: 1
content_length: 3
content_stride: 1
content_start_mode: slide_within
mode: splice
restrict_to_training_subset: true
initial_batch_size: 128
"""


def test_seed_single_document_yaml_makes_batches(root):
    config = parse(root, SEED_SINGLE_EXACT.format(root=root))
    Pos = hax.Axis("position", SEQ)
    train = config.train_set(Pos, None, key=0)
    batch = train.batch(np.arange(8))
    assert np.asarray(batch.tokens).shape == (8, SEQ) and np.asarray(batch.loss_mask).sum() > 0
    assert list(config.selected(config.cache(), SEQ).indices) == [12]
    assert config.validation_sets(Pos)  # the seed's validation grid
