"""Escaping literal ``[DOC]``/``[EOD]`` in text, so that only the writer makes structural markers.

A tokenizer that knows ``[DOC]`` as a special token turns the text ``"see [DOC] here"`` into the
structural id. Escaping inserts one backslash after the bracket of every ``[DOC]``/``[EOD]`` that
is already preceded by any number (zero included) of backslashes, so no literal marker survives,
and ``unescape`` removes exactly that backslash again::

    escape("a[DOC]b")        -> "a[\\DOC]b"
    escape("a[\\DOC]b")      -> "a[\\\\DOC]b"      (already escaped-looking text stays reversible)
    unescape(escape(text))   == text             for every text

Only the marker spellings are touched; every other backslash and bracket is left alone, so the
token distribution of ordinary text does not move.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from meshbatch.cache import Tokenizer

MARKER_TEXTS = ("[DOC]", "[EOD]")
_ESCAPE = re.compile(r"\[(\\*)(DOC|EOD)\]")
_UNESCAPE = re.compile(r"\[\\(\\*)(DOC|EOD)\]")


def escape(text: str) -> str:
    """``text`` with no literal ``[DOC]``/``[EOD]`` left (see the module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (got text={text!r})")
    return _ESCAPE.sub(r"[\\\1\2]", text)


def unescape(text: str) -> str:
    """The inverse of ``escape``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (got text={text!r})")
    return _UNESCAPE.sub(r"[\1\2]", text)


class EscapingTokenizer:
    """A tokenizer that escapes literal markers before encoding (and unescapes after decoding).

    Args:
        inner: the tokenizer doing the work.
    """

    def __init__(self, inner: Tokenizer):
        self.inner = inner

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return self.inner.encode_batch([escape(t) for t in texts])

    def decode(self, ids: Sequence[int]) -> str:
        return unescape(self.inner.decode(ids))

    def metadata(self) -> dict[str, Any]:
        return {**self.inner.metadata(), "escape_literal_markers": True}
