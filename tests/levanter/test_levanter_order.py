"""Issue 34: a run's data order record (``meshbatch.levanter.order``): a Levanter block records the
same order with and without ``type:``; another order is refused by name with the lines that give
the checkpoint's; a checkpoint without a record (Levanter's own loader) resumes in Levanter's order
only. The training runs that write and check these records are in tests/levanter/test_resume_order.py."""

import logging
import textwrap

import draccus
import jax
import pytest

from meshbatch.levanter.order import (
    DataOrderMismatch,
    check,
    check_content,
    describe,
    key_hex,
    levanter_order,
)
from meshbatch.levanter.train_lm import TrainLmConfig

SINGLE = "train_urls: [a.jsonl]\nshuffle: {shuffle}\n"
MIXTURE = """\
configs: {{web: {{train_urls: [w.jsonl]}}, off: {{train_urls: [o.jsonl]}}, code: {{train_urls: [c.jsonl]}}}}
train_weights: {{web: 0.7, off: 0.0, code: 0.3}}
mixture_block_size: 16
shuffle: {shuffle}
"""
KEY = jax.random.PRNGKey(3)


def parse(tmp_path, data: str):
    path = tmp_path / "cfg.yaml"
    path.write_text("data:\n" + textwrap.indent(textwrap.dedent(data), "  "))
    return draccus.parse(TrainLmConfig, config_path=str(path), args=[]).data


def ours(config) -> dict:
    """What ``announce`` records for the train set (the built components: those weighted)."""
    record = config.order(config.weighted("train")) if hasattr(config, "weighted") else config.order()
    return {**record, "data_key": key_hex(KEY)}


@pytest.mark.parametrize("shuffle", ["false", "true", "5"])
@pytest.mark.parametrize(("block", "kind"), [(SINGLE, "causal_lm"), (MIXTURE, "stable_mixture")])
def test_a_block_records_the_same_order_with_and_without_type(tmp_path, block, kind, shuffle):
    theirs = levanter_order(parse(tmp_path, block.format(shuffle=shuffle)), KEY)
    mine = ours(parse(tmp_path, f"type: {kind}\n" + block.format(shuffle=shuffle)))
    check(theirs, mine, "step-3")  # no mismatch
    check(mine, theirs, "step-3")
    if kind == "stable_mixture":
        assert theirs["components"] == ["web", "code"] and theirs["mixture_compat"] == "levanter"
    assert describe(mine)[0] == describe(theirs)[0]


@pytest.mark.parametrize(
    ("extra", "named", "line"),
    [
        (
            "compat: strong\n",
            "sources['web'].compat: checkpoint levanter, this run strong",
            "compat: levanter",
        ),
        (
            "mixture_compat: exact\n",
            "mixture_compat: checkpoint levanter, this run exact",
            "mixture_compat: levanter",
        ),
        ("permutation_type: feistel\n", "permutation_type: checkpoint linear", "permutation_type: linear"),
    ],
)
def test_another_order_is_refused_by_name_with_the_line_to_add(tmp_path, extra, named, line):
    saved = levanter_order(parse(tmp_path, MIXTURE.format(shuffle="true")), KEY)
    now = ours(parse(tmp_path, "type: stable_mixture\n" + MIXTURE.format(shuffle="true") + extra))
    with pytest.raises(DataOrderMismatch) as error:
        check(saved, now, "ckpt/step-3")
    message = str(error.value)
    assert "the checkpoint ckpt/step-3 was trained in another data order" in message
    assert named in message and f"To continue its order, set under data: {line}" in message, message


def test_other_weights_components_and_keys_are_refused(tmp_path):
    saved = levanter_order(parse(tmp_path, MIXTURE.format(shuffle="true")), KEY)
    weights = MIXTURE.replace("off: 0.0, code: 0.3", "off: 0.1, code: 0.2").format(shuffle="true")
    with pytest.raises(DataOrderMismatch, match=r"components: checkpoint \["):
        check(saved, ours(parse(tmp_path, "type: stable_mixture\n" + weights)), "c")
    with pytest.raises(DataOrderMismatch, match="train_weights: checkpoint"):
        check(saved, ours(parse(tmp_path, "type: stable_mixture\n" + MIXTURE.replace("0.7", "0.6").format(
            shuffle="true"))), "c")  # fmt: skip
    with pytest.raises(DataOrderMismatch, match=r"data_key: .*the checkpoint's trainer.seed"):
        check(saved, {**saved, "data_key": key_hex(jax.random.PRNGKey(4))}, "c")
    with pytest.raises(DataOrderMismatch, match="config: checkpoint mixture, this run single source"):
        check(saved, levanter_order(parse(tmp_path, SINGLE.format(shuffle="true")), KEY), "c")


@pytest.mark.parametrize(
    ("data", "ok", "lines"),
    [
        ("type: causal_lm\n" + SINGLE.format(shuffle="true"), True, ""),
        ("type: causal_lm\n" + SINGLE.format(shuffle="7"), True, ""),
        ("type: stable_mixture\n" + MIXTURE.format(shuffle="true"), True, ""),
        ("type: causal_lm\n" + SINGLE.format(shuffle="true") + "compat: strong\n", False, "compat: levanter"),
        (
            "type: stable_mixture\n" + MIXTURE.format(shuffle="false") + "mixture_compat: exact\n",
            False,
            "mixture_compat: levanter",
        ),
        ("type: causal_lm\n" + SINGLE.format(shuffle="block"), False, "Levanter has no block shuffle"),
        (
            "type: token_balanced_mixture\nconfigs: {a: {train_urls: [a]}, b: {train_urls: [b]}}\n",
            False,
            "a Levanter-trainable config (not token_balanced_mixture)",
        ),
    ],
)
def test_a_checkpoint_without_a_record_resumes_in_levanters_order_only(
    tmp_path, monkeypatch, data, ok, lines
):
    """No ``meshbatch_data_order.json``: Levanter's own loader wrote it (or meshbatch before the
    records); ``MESHBATCH_DATA_ORDER_CHECK=off`` resumes anyway, saying so."""
    now = ours(parse(tmp_path, data))
    if ok:
        check(None, now, "step-3")
        return
    with pytest.raises(DataOrderMismatch, match=r"has no meshbatch_data_order\.json") as error:
        check(None, now, "step-3")
    assert lines in str(error.value), str(error.value)
    monkeypatch.setenv("MESHBATCH_DATA_ORDER_CHECK", "off")
    check(None, now, "step-3")


CHAT_MIXTURE = """\
configs: {{web: {{train_urls: [w.jsonl]}}, chat: {{train_urls: [c.jsonl], format: {{type: chat{pack}}}}}}}
train_weights: {{web: 0.6, chat: 0.4}}
shuffle: true
"""


@pytest.mark.parametrize(
    ("block", "kind"),
    [
        (SINGLE.format(shuffle="true") + "format: {type: supervised}\n", "causal_lm"),
        (SINGLE.format(shuffle="5") + "format: {type: chat, single_turn: true}\n", "causal_lm"),
        (CHAT_MIXTURE.format(pack=""), "stable_mixture"),
    ],
)
def test_a_packed_source_records_its_packing_with_and_without_type(tmp_path, block, kind):
    """Issue 36: a chat/supervised source's record names its packing (``format``, ``pack``; a
    single-turn chat packs as supervised), the same with and without ``type:``."""
    theirs = levanter_order(parse(tmp_path, block), KEY)
    mine = ours(parse(tmp_path, f"type: {kind}\n" + block))
    assert mine == theirs
    packed = [s for s in mine["sources"].values() if "format" in s]
    assert len(packed) == 1 and packed[0]["format"] in ("chat", "supervised") and packed[0]["pack"] is True
    if kind == "stable_mixture":
        assert "format" not in mine["sources"]["web"]  # a text component's record is unchanged


def test_another_packing_is_refused_by_name(tmp_path):
    saved = ours(parse(tmp_path, "type: stable_mixture\n" + CHAT_MIXTURE.format(pack="")))
    now = ours(parse(tmp_path, "type: stable_mixture\n" + CHAT_MIXTURE.format(pack=", pack: false")))
    with pytest.raises(DataOrderMismatch, match=r"sources\['chat'\]\.pack: checkpoint true, this run false"):
        check(saved, now, "step-3")


def test_another_content_fingerprint_warns_naming_both(caplog):
    """Issue 37: a resume over other content is a WARNING naming both fingerprints, not a refusal."""
    with caplog.at_level(logging.INFO, logger="meshbatch.levanter.order"):
        assert check_content("a" * 32, "a" * 32, "ckpt/step-3")
        assert not check_content("a" * 32, "b" * 32, "ckpt/step-3")
        assert not check_content(None, "b" * 32, "ckpt/step-3")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    message = warnings[0].getMessage()
    a, b = "a" * 32, "b" * 32
    assert f"ckpt/step-3 was trained on other content: content fingerprint {a} in the checkpoint, " in message
    assert f"{b} in this run" in message
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("trained on this content" in m for m in infos)
    assert any("no content fingerprint" in m for m in infos)


def test_a_version_1_record_of_a_packed_source_resumes_a_version_2_one_refuses(tmp_path, caplog):
    """A record written before packing fields (version 1) of a chat source resumes (its packing
    was Levanter's, as now), said at INFO; a current record without them (a text source) is refused
    against a chat source of the same name."""
    block = SINGLE.format(shuffle="true") + "format: {type: chat}\n"
    now = ours(parse(tmp_path, "type: causal_lm\n" + block))
    source = {k: v for k, v in now["sources"][""].items() if k not in ("format", "pack")}
    old = {**now, "sources": {"": source}}
    with caplog.at_level(logging.INFO, logger="meshbatch.levanter.order"):
        check(old, now, "step-3", version=1)
    assert any("predates packing fields" in r.getMessage() for r in caplog.records)
    with pytest.raises(DataOrderMismatch, match="format: checkpoint null, this run chat"):
        check(old, now, "step-3")
