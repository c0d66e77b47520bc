"""Escaping literal [DOC]/[EOD] text: reversible, and with it no literal marker becomes structural,
even with a tokenizer that knows [DOC] and [EOD] as special tokens."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from meshbatch.cache import HFTokenizer
from meshbatch.datasets.preblocked import escape, open_blocks, preblock, unescape
from meshbatch.datasets.preblocked.block_validation import validate_path

TEXTS = [
    "plain text without markers",
    "inside a word: foo[DOC]bar and baz[EOD]qux",
    "[DOC] at the very start",
    "at the very end [EOD]",
    "[DOC]",
    "[EOD]",
    "[EOD][DOC] back to back [DOC][EOD]",
    "already escaped-looking: [\\DOC] and [\\\\EOD] stay distinct",
    "near misses: [DOC [doc] DOC] [ DOC] [DOCS]",
]


@pytest.mark.parametrize("text", TEXTS)
def test_escape_round_trip_and_no_literal_marker_left(text):
    escaped = escape(text)
    assert "[DOC]" not in escaped and "[EOD]" not in escaped
    assert unescape(escaped) == text


def test_escape_is_reversible_on_random_text():
    rng = random.Random(0)
    alphabet = ["[", "]", "\\", "D", "O", "C", "E", "x", "[DOC]", "[EOD]"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        escaped = escape(text)
        assert unescape(escaped) == text
        assert "[DOC]" not in escaped and "[EOD]" not in escaped
    assert escape("no markers [at] all \\ here") == "no markers [at] all \\ here"  # nothing else moves


@pytest.fixture(scope="module")
def marker_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer trained here (no download) with [DOC], [EOD], [PAD] special."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["[DOC]", "[EOD]", "[PAD]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXTS * 4, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "docs.jsonl"
    with open(path, "w") as f:
        for text in TEXTS:
            f.write(json.dumps({"text": text}) + "\n")
    return str(path)


def test_without_escaping_literal_markers_become_structural(marker_tokenizer, corpus, tmp_path):
    tokenizer = HFTokenizer(marker_tokenizer, add_special_tokens=False)
    out = str(tmp_path / "raw")
    header = preblock(out, [corpus], block_size=32, tokenizer=tokenizer, shuffle_level="none", progress=False)
    assert header.doc_id == tokenizer._tokenizer.token_to_id("[DOC]")  # the tokenizer's own markers
    literal = sum(t.count("[DOC]") + t.count("[EOD]") for t in TEXTS)
    assert literal == 10 and header.counts["literal_markers"] == literal  # each one is structural now
    assert not validate_path(out, carry_open_doc=True, progress=False).ok


def test_with_escaping_no_marker_is_structural_and_text_comes_back(marker_tokenizer, corpus, tmp_path):
    tokenizer = HFTokenizer(marker_tokenizer, add_special_tokens=False)
    out = str(tmp_path / "escaped")
    header = preblock(
        out,
        [corpus],
        block_size=32,
        tokenizer=tokenizer,
        shuffle_level="none",
        rule="greedy",
        escape_literal_markers=True,
        progress=False,
    )
    assert header.escape_literal_markers and header.counts["literal_markers"] == 0
    assert header.source["tokenizer"]["escape_literal_markers"] is True
    assert validate_path(out, carry_open_doc=True, progress=False).ok
    source = open_blocks(out)
    stream = source.read_blocks(np.arange(source.num_blocks)).reshape(-1)
    docs, current = [], None
    for token in stream.tolist():
        if token == header.doc_id:
            current = []
        elif token == header.eod_id:
            docs.append(current)
            current = None
        elif current is not None:
            current.append(token)
    assert [unescape(tokenizer.decode(d)) for d in docs] == TEXTS  # greedy, no shuffle: source order
