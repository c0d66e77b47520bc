"""Issue 34: refusals that name the bad value and give the working alternative, first.

Every mixture weight is checked before components at weight 0 are dropped (a negative weight
used to drop its component silently); a meshbatch ``type:`` decodes as that type alone, so its
error is not buried under one line per other member of ``TrainLmConfig.data``'s union; a typo in
``type:`` lists the types; a source the type does not read names the type that does.
"""

import asyncio
import textwrap

import draccus
import pytest

from meshbatch.levanter import ConfigError
from meshbatch.levanter.train_lm import TrainLmConfig

SOURCES = "configs: {web: {train_urls: [w.jsonl]}, code: {train_urls: [c.jsonl]}}\n"


def parse(tmp_path, data: str, args=()):
    path = tmp_path / "cfg.yaml"
    path.write_text("data:\n" + textwrap.indent(textwrap.dedent(data), "  "))
    return draccus.parse(TrainLmConfig, config_path=str(path), args=list(args)).data


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0]


BAD_WEIGHTS = [
    ("{web: -0.5, code: 0.5}", r"train_weights\['web'\]=-0.5"),
    ("{web: .nan, code: 0.5}", r"train_weights\['web'\]=nan"),
    ("{web: .inf, code: 0.5}", r"train_weights\['web'\]=inf"),
    ("[[0, {web: 0.5, code: 0.5}], [4, {web: 1.0, code: -1.0}]]", r"train_weights\[1\] .*\['code'\]=-1.0"),
    ("{web: 0.0, code: -.inf}", r"train_weights\['code'\]=-inf"),
]


@pytest.mark.parametrize(("weights", "named"), BAD_WEIGHTS)
@pytest.mark.parametrize("kind", ["stable_mixture", "token_balanced_mixture", "splice_base"])
def test_every_weight_is_checked_before_components_are_dropped(tmp_path, kind, weights, named):
    """``{web: -0.5, code: 0.5}`` trained 100% on ``code`` before; now each mixture type (and a
    splice config's mixture base) refuses it by name, at parse time, before any cache is built."""
    if kind == "splice_base":
        base = f"  type: mixture\n  {SOURCES}  train_weights: {weights}\n"
        data = f"type: splice_multi_document\ndataset_name: code\nbase:\n{base}"
    else:
        data = f"type: {kind}\n{SOURCES}train_weights: {weights}\n"
    with pytest.raises(ConfigError, match=named) as error:
        parse(tmp_path, data)
    assert "finite number >= 0" in str(error.value)


def test_levanter_refuses_a_negative_weight_too(tmp_path):
    """The same block without ``type:`` is Levanter's own config: its ``MixtureDataset`` refuses
    the negative weight when the mixture is made (meshbatch refuses it at parse time, by name)."""
    import jax
    from levanter.data.dataset import ListAsyncDataset
    from levanter.data.mixture import MixtureDataset

    config = parse(tmp_path, f"{SOURCES}train_weights: {{web: -0.5, code: 1.0}}\n")
    # ListAsyncDataset makes a Future: it needs a current event loop, which an earlier test's
    # asyncio.run (tests in the same process) leaves unset
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        datasets = {name: ListAsyncDataset([1, 2, 3]) for name in config.train_weights}
        with pytest.raises(ValueError, match="cannot be negative"):
            MixtureDataset(datasets, dict(config.train_weights), block_size=8, key=jax.random.PRNGKey(0))
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_a_zero_weight_is_accepted_and_left_out(tmp_path):
    config = parse(tmp_path, f"type: stable_mixture\n{SOURCES}train_weights: {{web: 0.0, code: 1.0}}\n")
    assert config.weighted("train") == ["code"]


def test_type_causal_lm_on_an_hf_block_names_hf_causal_lm(tmp_path):
    with pytest.raises(draccus.utils.ParsingError) as error:
        parse(tmp_path, "type: causal_lm\nid: org/corpus\nname: en\n")
    assert "use type: hf_causal_lm" in first_line(error.value), str(error.value)
    assert len(str(error.value).splitlines()) == 1  # no line per other union member
    fixed = parse(tmp_path, "type: hf_causal_lm\nid: org/corpus\nname: en\n")
    assert type(fixed).__name__ == "HfCausalLMConfig"


@pytest.mark.parametrize(
    ("data", "wanted"),
    [
        ("type: hf_causal_lm\ntrain_urls: [a.jsonl]\n", "use type: causal_lm"),
        ("type: causal_lm\n" + SOURCES, "use type: stable_mixture"),
        ("type: stable_mixture\ntrain_urls: [a.jsonl]\n", "use type: causal_lm"),
    ],
)
def test_a_source_the_type_does_not_read_names_the_type_that_does(tmp_path, data, wanted):
    with pytest.raises(draccus.utils.ParsingError) as error:
        parse(tmp_path, data)
    assert wanted in first_line(error.value), str(error.value)


def test_a_typo_in_type_lists_the_types(tmp_path):
    with pytest.raises(draccus.utils.ParsingError) as error:
        parse(tmp_path, "type: stable_mixtrue\n" + SOURCES)
    line = first_line(error.value)
    assert "type: 'stable_mixtrue' is not a data config type (did you mean 'stable_mixture'?)" in line
    types = "causal_lm hf_causal_lm stable_mixture token_balanced_mixture splice_single_document"
    for name in types.split():
        assert name in line, line


def test_an_error_of_a_meshbatch_type_is_its_own_first_line(tmp_path):
    with pytest.raises(draccus.utils.ParsingError) as error:
        parse(tmp_path, "type: causal_lm\nalpah: 3\n")
    assert str(error.value) == "`data`: The fields `alpah` are not valid for CausalLMConfig"


def test_a_splice_config_with_base_null_says_what_base_is(tmp_path):
    with pytest.raises(draccus.utils.ParsingError) as error:
        parse(tmp_path, "type: splice_multi_document\nbase: null\n")
    assert first_line(error.value).startswith("`data`: base: null: a splice config reads its text from base")
    assert "Expected a dict for a choice class" not in str(error.value)


@pytest.mark.parametrize(
    "component",
    [
        "{train_urls: [c.jsonl], format: {type: chat}}",
        "{id: org/chats, format: {type: chat}}",
        "{train_urls: [c.jsonl], format: {type: supervised}}",
    ],
)
def test_a_chat_or_supervised_component_is_mixed(tmp_path, component):
    """Issue 36: a mixture of text and chat/supervised components (Levanter's
    ``gpt2_small_fast_mix_chat.yaml`` shape) parses, its component's format kept; its packed rows
    train on the fast path (tests/levanter/test_chat_train.py)."""
    data = f"type: stable_mixture\nconfigs: {{web: {{train_urls: [w.jsonl]}}, chat: {component}}}\n"
    config = parse(tmp_path, data + "train_weights: {web: 0.5, chat: 0.5}\n")
    assert type(config).__name__ == "StableMixtureLMConfig"
    formats = ("ChatLmDatasetFormat", "SupervisedLmDatasetFormat")
    assert type(config.configs["chat"].format).__name__ in formats


def test_levanter_blocks_without_type_still_decode_as_levanters(tmp_path):
    from levanter.data.text import HfSingleDatasetLMConfig, LMMixtureDatasetConfig, UrlSingleDatasetLMConfig

    assert type(parse(tmp_path, "train_urls: [a.jsonl]\n")) is UrlSingleDatasetLMConfig
    assert type(parse(tmp_path, "id: org/corpus\n")) is HfSingleDatasetLMConfig
    assert type(parse(tmp_path, SOURCES + "train_weights: {web: 1.0}\n")) is LMMixtureDatasetConfig
