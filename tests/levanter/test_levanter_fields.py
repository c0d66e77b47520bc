"""Must-show 4: every field of the installed Levanter's data config classes is honoured or refused
by every meshbatch config type that extends it (``meshbatch.levanter.FIELDS``), and so is every
field meshbatch adds (``fields.OWN``), both mirrored in docs/levanter.md; a field neither table
decides fails ``refuse``; a refused field fails at parse time naming itself and the reason;
honoured top-level fields reach the dataset."""

import dataclasses
import json
import textwrap

import draccus
import haliax as hax
import numpy as np
import pytest
from levanter.data import text
from levanter.store.cache import SerialCacheWriter

from meshbatch.cache import ByteTokenizer
from meshbatch.levanter import FIELDS
from meshbatch.levanter.config import CausalLMConfig, HfCausalLMConfig
from meshbatch.levanter.fields import HONOURED, OWN, REFUSED, refuse
from meshbatch.levanter.mixture_config import StableMixtureLMConfig, TokenBalancedMixtureLMConfig
from meshbatch.levanter.sources import MixtureBaseConfig, UrlBaseConfig
from meshbatch.levanter.splice_config import SpliceMultiDocumentLMConfig, SpliceSingleDocumentLMConfig
from meshbatch.levanter.train_lm import TrainLmConfig

FORMATS = [text.TextLmDatasetFormat, text.ChatLmDatasetFormat, text.SupervisedLmDatasetFormat]
SOURCES = [text.UrlDatasetSourceConfig, text.HfDatasetSourceConfig]
EXTENDS = {
    "causal_lm": [text.LMTaskConfig, text.UrlSingleDatasetLMConfig, *FORMATS],
    "hf_causal_lm": [text.LMTaskConfig, text.HfSingleDatasetLMConfig, *FORMATS],
    "stable_mixture": [text.LMTaskConfig, text.LMMixtureDatasetConfig, *SOURCES, *FORMATS],
    "token_balanced_mixture": [text.LMTaskConfig, text.LMMixtureDatasetConfig, *SOURCES, *FORMATS],
    "splice": [text.LMTaskConfig],
    "splice base": [text.UrlSingleDatasetLMConfig, text.LMMixtureDatasetConfig, *SOURCES, *FORMATS],
}


def names(classes) -> set[str]:
    return {f.name for cls in classes for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("kind", sorted(EXTENDS))
def test_every_levanter_field_is_honoured_or_refused(kind):
    undecided = names(EXTENDS[kind]) - set(FIELDS[kind])
    assert not undecided, f"{kind}: Levanter fields neither honoured nor refused: {sorted(undecided)}"
    stale = set(FIELDS[kind]) - names(EXTENDS[kind])
    assert not stale, f"{kind}: table rows for fields Levanter does not have: {sorted(stale)}"


MESHBATCH = {
    "causal_lm": [CausalLMConfig],
    "hf_causal_lm": [HfCausalLMConfig],
    "stable_mixture": [StableMixtureLMConfig],
    "token_balanced_mixture": [TokenBalancedMixtureLMConfig],
    "splice": [SpliceMultiDocumentLMConfig, SpliceSingleDocumentLMConfig],
    "splice base": [UrlBaseConfig, MixtureBaseConfig],
}


@pytest.mark.parametrize("kind", sorted(MESHBATCH))
def test_every_meshbatch_field_is_honoured_or_refused(kind):
    """The fields meshbatch adds to Levanter's classes are exactly ``OWN[kind]``'s rows."""
    added = names(MESHBATCH[kind]) - names(EXTENDS[kind])
    assert added == set(OWN[kind]), (
        f"{kind}: undecided {sorted(added - set(OWN[kind]))}, stale {sorted(set(OWN[kind]) - added)}"
    )


def test_a_field_neither_table_decides_fails():
    """``refuse`` fails for a config field missing from both tables (it used to pass it as honoured)."""

    @dataclasses.dataclass(frozen=True)
    class Later:
        tokenizer: str = "gpt2"
        surprise: int = 0

    with pytest.raises(RuntimeError, match=r"Later\.surprise is neither honoured nor refused for causal_lm"):
        refuse(Later(), "causal_lm")


def fields_markdown(tables: dict[str, dict[str, tuple[str, str]]] | None = None) -> str:
    """A table of docs/levanter.md, as it is to be regenerated (``FIELDS`` by default, or ``OWN``):
    a row per field (fields decided alike share one), a column per config type (``honoured``,
    ``honoured: how`` where it differs from the row's, ``refused: why``, or ``-`` where the type
    has no such field)."""
    tables = FIELDS if tables is None else tables
    kinds = list(tables)
    rows = ["| field | " + " | ".join(f"`{k}`" for k in kinds) + " | how it is honoured |",
            "|---" * (len(kinds) + 2) + "|"]  # fmt: skip
    names = list(dict.fromkeys(name for table in tables.values() for name in table))
    grouped: dict[tuple[str, ...], list[str]] = {}  # fields decided alike share a row
    for name in names:
        notes = [tables[kind].get(name, ("-", "")) for kind in kinds]
        how = next((note for status, note in notes if status == HONOURED), "")
        cells = [
            f"refused: {note}" if status == REFUSED else "honoured" if status != HONOURED or note == how
            else f"honoured: {note}"
            for status, note in notes
        ]  # fmt: skip
        cells = [cell if status != "-" else "-" for cell, (status, _) in zip(cells, notes, strict=True)]
        grouped.setdefault((*cells, how), []).append(f"`{name}`")
    rows += [f"| {', '.join(group)} | " + " | ".join(cells) + " |" for cells, group in grouped.items()]
    return "\n".join(rows)


def test_the_docs_mirror_the_table():
    """docs/levanter.md holds both tables exactly as ``fields_markdown()`` renders ``FIELDS`` and ``OWN``."""
    doc = open("docs/levanter.md").read()
    assert fields_markdown() in doc, "regenerate the Levanter table in docs/levanter.md"
    assert fields_markdown(OWN) in doc, "regenerate the meshbatch table in docs/levanter.md"


VALUES = {
    "target_budget": "100", "experiment_budget": "10", "max_train_batches": "{a: 1}",
    "num_validation_sequences": "{a: 1}", "train_weights": "{a: 1.0}", "stop_strategy": "first_exhausted",
    "mixture_block_size": "16", "shuffle": "true", "permutation_type": "feistel", "cache_dir": "elsewhere",
    "chat_template": "x", "ignore_token_id": "5", "eos_id": "5", "tags": "[t]", "validation_urls": "[v]",
    "quick_start": "true", "shuffle_per_epoch": "true",
}  # fmt: skip
PREFIX = {
    "causal_lm": "type: causal_lm\n",
    "hf_causal_lm": "type: hf_causal_lm\nid: x\n",
    "stable_mixture": "type: stable_mixture\nconfigs: {a: {train_urls: [x]}}\n",
    "token_balanced_mixture": "type: token_balanced_mixture\nconfigs: {a: {train_urls: [x]}}\n",
    "splice": "type: splice_multi_document\n",
    "splice base": "type: splice_multi_document\n",
}
REFUSED_ROWS = [(k, n) for k, t in FIELDS.items() for n, (s, _) in t.items() if s == REFUSED]
REFUSED_ROWS += [(k, n) for k, t in OWN.items() for n, (s, _) in t.items() if s == REFUSED]


def parse(tmp_path, data: str):
    path = tmp_path / "cfg.yaml"
    path.write_text("data:\n" + textwrap.indent(data, "  "))
    return draccus.parse(TrainLmConfig, config_path=str(path), args=[]).data


@pytest.mark.parametrize(("kind", "name"), REFUSED_ROWS)
def test_refused_fields_fail_at_parse_time_naming_field_and_reason(tmp_path, kind, name):
    if kind == "splice base" and name in names([UrlBaseConfig]):
        data = PREFIX[kind] + f"base: {{type: url_single_dataset, train_urls: [x], {name}: {VALUES[name]}}}\n"
    elif kind == "splice base":
        data = (
            PREFIX[kind]
            + f"base: {{type: mixture, configs: {{a: {{train_urls: [x]}}}}, {name}: {VALUES[name]}}}\n"
        )
    else:
        data = PREFIX[kind] + f"{name}: {VALUES[name]}\n"
    with pytest.raises(Exception, match=rf"{name}=.* is refused by {kind}: \w+"):
        parse(tmp_path, data)


def test_honoured_task_fields_reach_the_dataset(tmp_path):
    """``ignore_token_id`` masks targets, the tokenizer's EOS splits segments (Levanter's
    ``eos_id``), ``cache_dir`` is where the cache is built, ``vocab_size`` sizes the passthrough
    tokenizer over a pre-tokenized cache."""
    ByteTokenizer().save_pretrained(str(tmp_path / "tok"))
    with open(tmp_path / "train.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"text": f"doc {i} " + "ab " * 20}) + "\n")
    config = parse(
        tmp_path,
        f"type: causal_lm\ntokenizer: {tmp_path}/tok\ncache_dir: {tmp_path}/c\n"
        f"train_urls: [{tmp_path}/train.jsonl]\nignore_token_id: 32\n",
    )
    Pos = hax.Axis("position", 16)
    dataset = config.train_set(Pos, None, key=0)
    assert (tmp_path / "c" / "train" / "shard_ledger.json").is_file()
    assert dataset.dataset.eos_id == config.the_tokenizer.eos_token_id == 256
    batch = dataset.batch(np.arange(4))
    tokens, mask = np.asarray(batch.tokens), np.asarray(batch.loss_mask)
    assert np.all(mask[:, :-1][tokens[:, 1:] == 32] == 0)  # no space is ever a target
    assert np.any(mask[:, :-1][tokens[:, 1:] != 32] != 0)
    # passthrough: a pre-tokenized cache (written here with Levanter's own SerialCacheWriter) read
    # with Levanter's PassthroughTokenizer of vocab_size ids.
    docs = [np.arange(i, i + 40, dtype=np.int32) for i in range(5)]
    with SerialCacheWriter(str(tmp_path / "pre" / "train"), {"input_ids": np.zeros(0, np.int32)}) as writer:
        writer.write_batch([{"input_ids": d} for d in docs])
    passthrough = parse(
        tmp_path,
        f"type: causal_lm\ntokenizer: passthrough\nvocab_size: 100\ncache_dir: {tmp_path}/pre\n"
        f"train_urls: [{tmp_path}/nowhere.jsonl]\n",
    )
    assert len(passthrough.the_tokenizer) == 100
    cache = passthrough.cache("train")
    assert [list(map(int, doc)) for doc in cache.read_rows(np.arange(5))] == [list(map(int, d)) for d in docs]
    missing = parse(
        tmp_path,
        f"type: causal_lm\ntokenizer: passthrough\nvocab_size: 9\ncache_dir: {tmp_path}/no\n"
        f"train_urls: [{tmp_path}/train.jsonl]\n",
    )
    with pytest.raises(ValueError, match="pre-tokenized"):
        missing.cache("train")
    with pytest.raises(Exception, match="vocab_size"):
        parse(tmp_path, "type: causal_lm\ntokenizer: passthrough\n")
