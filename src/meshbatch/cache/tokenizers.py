"""Tokenizers for building caches from text: a built-in byte tokenizer and Hugging Face ``tokenizers``.

The byte tokenizer needs no files: a token is a UTF-8 byte, and 256 ends a document::

    ByteTokenizer().encode_batch(["hé"]) -> [array([104, 195, 169, 256])]

``HFTokenizer`` loads a local ``tokenizer.json`` with the ``tokenizers`` package (imported only when
one is built). Both report ``metadata()``, which the cache ledger records so that a resumed build
cannot silently switch tokenizers.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class Tokenizer(Protocol):
    """What ``build_cache`` needs from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text (int64 ``[tokens]`` each)."""
        ...

    def metadata(self) -> dict[str, Any]:
        """A JSON-able description that changes whenever the tokenization would."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255, with optional end-of-document token 256.

    Args:
        add_eos: append ``eos_id`` (256) to every document.
    """

    eos_id = 256

    def __init__(self, *, add_eos: bool = True):
        self.add_eos = add_eos

    @property
    def vocab_size(self) -> int:
        return 257

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        eos = [self.eos_id] if self.add_eos else []
        return [np.array([*text.encode("utf-8"), *eos], dtype=np.int64) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, dropping end-of-document tokens (invalid UTF-8 becomes U+FFFD)."""
        return bytes(int(i) for i in ids if i != self.eos_id).decode("utf-8", errors="replace")

    def metadata(self) -> dict[str, Any]:
        return {"tokenizer": "byte", "add_eos": self.add_eos}


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer loaded from a local ``tokenizer.json``.

    Args:
        path: the ``tokenizer.json`` file.
        add_special_tokens: apply the tokenizer's post-processor (e.g. BOS/EOS templates).
        eos_token: a token (e.g. ``"</s>"``) to append to every document.

    Raises:
        ImportError: the ``tokenizers`` package is not installed.
        FileNotFoundError: no file at ``path``.
        ValueError: ``eos_token`` is not in the vocabulary.
    """

    def __init__(self, path: str, *, add_special_tokens: bool = True, eos_token: str | None = None):
        try:
            from tokenizers import Tokenizer as _HFTokenizer
        except ImportError as e:
            raise ImportError("HFTokenizer needs `tokenizers`: pip install 'meshbatch[text]'") from e
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no tokenizer file at {path=}")
        with open(path, "rb") as f:
            self._sha256 = hashlib.sha256(f.read()).hexdigest()
        self._tokenizer = _HFTokenizer.from_file(path)
        self.path, self.add_special_tokens, self.eos_token = path, add_special_tokens, eos_token
        self.eos_id: int | None = None
        if eos_token is not None:
            self.eos_id = self._tokenizer.token_to_id(eos_token)
            if self.eos_id is None:
                raise ValueError(f"{eos_token=} is not in the vocabulary of {path}")

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=self.add_special_tokens)
        eos = [self.eos_id] if self.eos_id is not None else []
        return [np.array([*e.ids, *eos], dtype=np.int64) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode([int(i) for i in ids])

    def metadata(self) -> dict[str, Any]:
        return {
            "tokenizer": "huggingface",
            "sha256": self._sha256,
            "add_special_tokens": self.add_special_tokens,
            "eos_token": self.eos_token,
        }
