"""Issue 34, must-show 4: a Levanter config whose ``data:`` is ``!include``d from a shared file (26
of the 75 configs in Levanter's tree) switches to meshbatch with the type on the command line,
``--data.type causal_lm`` (and ``--data.<field>``), nothing edited: the shared file stays
Levanter's for every other config that includes it. (A real ``train_lm`` run resumed this way:
``tests/levanter/test_resume_order.py``.)"""

import pathlib

import draccus
import pytest
from levanter.data.text import LMMixtureDatasetConfig, UrlSingleDatasetLMConfig

from meshbatch import ShuffleSpec
from meshbatch.levanter import CausalLMConfig, StableMixtureLMConfig
from meshbatch.levanter.train_lm import TrainLmConfig

BLOCKS = pathlib.Path(__file__).parents[1] / "data" / "levanter"


@pytest.fixture
def configs(tmp_path) -> pathlib.Path:
    """Levanter's layout: ``config/data/<shared>.yaml`` included by ``config/<run>.yaml``."""
    (tmp_path / "config" / "data").mkdir(parents=True)
    for name in ("openwebtext_source.yaml", "pile_mixture.yaml"):
        shared = (BLOCKS / name).read_text().replace("{root}", str(tmp_path))  # as Levanter's, local
        (tmp_path / "config" / "data" / name).write_text(shared)
        run = name.replace("_source", "").replace("_mixture", "")
        text = f"data: !include data/{name}\nmodel: {{type: llama}}\ntrainer: {{seed: 0}}\n"
        (tmp_path / "config" / f"{run}").write_text(text)
    return tmp_path / "config"


def parse(configs: pathlib.Path, run: str, *args: str):
    return draccus.parse(TrainLmConfig, config_path=str(configs / run), args=list(args)).data


def test_the_type_on_the_command_line_switches_an_included_block(configs):
    shared = (configs / "data" / "openwebtext_source.yaml").read_text()
    assert type(parse(configs, "openwebtext.yaml")) is UrlSingleDatasetLMConfig  # Levanter's, unedited
    ours = parse(configs, "openwebtext.yaml", "--data.type", "causal_lm")
    assert type(ours) is CausalLMConfig
    theirs = parse(configs, "openwebtext.yaml")
    for name in ("train_urls", "validation_urls", "cache_dir", "tokenizer"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.shuffle_spec() == ShuffleSpec("none")  # Levanter's order: the shared file's
    assert (configs / "data" / "openwebtext_source.yaml").read_text() == shared


def test_fields_on_the_command_line_reach_the_included_block(configs):
    args = ["--data.type", "causal_lm", "--data.shuffle", "era", "--data.era_length", "16"]
    assert parse(configs, "openwebtext.yaml", *args).shuffle_spec() == ShuffleSpec(
        "era", kind="linear", compat="levanter", era_length=16
    )
    strong = parse(configs, "openwebtext.yaml", *args, "--data.compat", "strong")
    assert strong.shuffle_spec() == ShuffleSpec("era", kind="linear", era_length=16)


def test_a_mixture_included_block_takes_its_type_on_the_command_line(configs):
    assert type(parse(configs, "pile.yaml")) is LMMixtureDatasetConfig
    ours = parse(configs, "pile.yaml", "--data.type", "stable_mixture", "--data.mixture_block_size", "64")
    assert type(ours) is StableMixtureLMConfig and ours.mixture_compat == "levanter"
    assert ours.mixture_block_size == 64 and len(ours.configs) == 22
    exact = parse(configs, "pile.yaml", "--data.type", "stable_mixture", "--data.mixture_compat", "exact")
    assert exact.mixture_compat == "exact"


def test_a_wrong_type_on_the_command_line_names_the_right_one(configs, capsys):
    with pytest.raises(draccus.utils.ParsingError, match="use type: causal_lm"):
        parse(configs, "openwebtext.yaml", "--data.type", "hf_causal_lm")
    with pytest.raises(SystemExit):  # draccus's command line checks the choice itself
        parse(configs, "openwebtext.yaml", "--data.type", "causal_ml")
    error = capsys.readouterr().err
    assert "--data.type: invalid choice: 'causal_ml' (choose from 'causal_lm', 'hf_causal_lm'" in error
