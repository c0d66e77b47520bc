"""The top-level ``chat_template``: the installed Levanter never reads it, so it is refused by name
at parse time (nothing silently ignored), and the build refuses it again where it would have
changed a chat format's tokens (single-turn chat crashed in Levanter's processor)."""

import pytest
from levanter.data.text import ChatLmDatasetFormat, TextLmDatasetFormat

from meshbatch.levanter import CausalLMConfig
from meshbatch.levanter.caches import source_format
from meshbatch.levanter.sources import ConfigError

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.mark.parametrize(
    "fmt", [ChatLmDatasetFormat(), ChatLmDatasetFormat(single_turn=True), TextLmDatasetFormat()]
)
def test_a_top_level_chat_template_levanter_ignores_is_refused_by_name(tmp_path, fmt):
    """Whatever the format, at construction (parse time), before any cache is built."""
    with pytest.raises(
        ConfigError, match=r"chat_template=.* refused by causal_lm: the installed Levanter never"
    ):
        CausalLMConfig(
            tokenizer=str(tmp_path / "tok"), cache_dir=str(tmp_path / "cache"),
            train_urls=[str(tmp_path / "chat.jsonl")], chat_template=TEMPLATE, format=fmt,
        )  # fmt: skip
    assert not (tmp_path / "cache").exists()


def test_the_build_guard_names_a_template_levanter_would_not_read(tmp_path):
    """``source_format`` itself refuses the template where it would change a chat format's
    tokens (a second guard: the config refuses it first)."""
    for single_turn, named in ((False, "format.chat_template"), (True, "single-turn chat takes no template")):
        config = CausalLMConfig(format=ChatLmDatasetFormat(single_turn=single_turn))
        with pytest.raises(ValueError, match=rf"chat_template=.*not read by the installed Levanter.*{named}"):
            source_format(config, TEMPLATE)


def test_a_format_naming_its_template_or_a_text_format_is_levanters():
    own = ChatLmDatasetFormat(chat_template="{{ messages }}")
    assert source_format(CausalLMConfig(format=own), TEMPLATE) == own  # Levanter uses the format's
    text = TextLmDatasetFormat()
    assert source_format(CausalLMConfig(format=text), TEMPLATE) == text
    chat = ChatLmDatasetFormat()
    assert source_format(CausalLMConfig(format=chat), None) == chat
