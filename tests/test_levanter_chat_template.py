"""The top-level ``chat_template``: the installed Levanter never reads it, so where meshbatch would
have used it (a chat format naming no template) it is refused by name instead of tokenizing the
same YAML differently from Levanter (single-turn chat crashed in Levanter's processor)."""

import json

import pytest
from levanter.data.text import ChatLmDatasetFormat, TextLmDatasetFormat

from meshbatch.cache import ByteTokenizer
from meshbatch.levanter import CausalLMConfig
from meshbatch.levanter.caches import source_format

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.mark.parametrize("single_turn", [False, True])
def test_a_top_level_chat_template_levanter_ignores_is_refused_by_name(tmp_path, single_turn):
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    ByteTokenizer().save_pretrained(str(tmp_path / "tok"))
    config = CausalLMConfig(
        tokenizer=str(tmp_path / "tok"), cache_dir=str(tmp_path / "cache"),
        train_urls=[str(tmp_path / "chat.jsonl")], chat_template=TEMPLATE,
        format=ChatLmDatasetFormat(single_turn=single_turn),
    )  # fmt: skip
    named = "single-turn chat takes no template" if single_turn else "format.chat_template"
    with pytest.raises(ValueError, match=rf"chat_template=.*not read by the installed Levanter.*{named}"):
        config.build_split(config, "train", config.cache_dir)
    assert not (tmp_path / "cache" / "train").exists()


def test_a_format_naming_its_template_or_a_text_format_is_levanters():
    own = ChatLmDatasetFormat(chat_template="{{ messages }}")
    assert source_format(CausalLMConfig(format=own), TEMPLATE) == own  # Levanter uses the format's
    text = TextLmDatasetFormat()
    assert source_format(CausalLMConfig(format=text), TEMPLATE) == text
    chat = ChatLmDatasetFormat()
    assert source_format(CausalLMConfig(format=chat), None) == chat
