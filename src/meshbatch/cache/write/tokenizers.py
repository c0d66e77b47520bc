"""Tokenizers for building caches from text: a built-in byte tokenizer and Hugging Face ``tokenizers``.

The byte tokenizer needs no files: a token is a UTF-8 byte, and 256 ends a document::

    ByteTokenizer().encode_batch(["hé"]) -> [array([104, 195, 169, 256])]

``HFTokenizer`` loads a local ``tokenizer.json`` with the ``tokenizers`` package (imported only when
one is built). Both report ``metadata()``, which the cache ledger records so that a resumed build
cannot silently switch tokenizers.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from meshbatch.cache.format.checks import check_path


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

    def save_pretrained(self, directory: str) -> str:
        """Writes this tokenizer as a Hugging Face tokenizer directory; returns ``directory``.

        ``tokenizer.json`` (ids 0-255 the UTF-8 bytes, through GPT-2's byte-to-unicode alphabet and
        a byte-level BPE with no merges; ``<eos>`` = 256, appended by the post-processor when
        ``add_eos``), ``tokenizer_config.json`` and ``special_tokens_map.json``: what
        ``transformers.AutoTokenizer.from_pretrained(directory)`` (Levanter's ``tokenizer:``) and
        ``HFTokenizer(directory + "/tokenizer.json")`` load, offline, to the same ids as this one.

        Raises:
            ImportError: the ``tokenizers`` package is not installed.
        """
        try:
            from tokenizers import Tokenizer as _HFTokenizer
            from tokenizers import decoders, models, pre_tokenizers, processors
        except ImportError as e:
            raise ImportError("save_pretrained needs `tokenizers`: pip install 'meshbatch[text]'") from e
        directory = check_path("directory", directory)
        alphabet = _gpt2_byte_alphabet()
        vocab = {alphabet[b]: b for b in range(256)} | {"<eos>": self.eos_id}
        tokenizer = _HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens(["<eos>"])
        if self.add_eos:
            tokenizer.post_processor = processors.TemplateProcessing(
                single="$A <eos>", pair="$A <eos> $B <eos>", special_tokens=[("<eos>", self.eos_id)]
            )
        os.makedirs(directory, exist_ok=True)
        tokenizer.save(os.path.join(directory, "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": "<eos>",
            "model_max_length": 1 << 30,
            "clean_up_tokenization_spaces": False,
        }
        for name, content in (
            ("tokenizer_config.json", config),
            ("special_tokens_map.json", {"eos_token": "<eos>"}),
        ):
            with open(os.path.join(directory, name), "w") as f:
                json.dump(content, f, indent=1)
        return directory


def _gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what byte-level BPE vocabularies use)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = dict(zip(printable, printable, strict=True))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {b: chr(c) for b, c in chars.items()}


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer loaded from a local ``tokenizer.json``.

    Args:
        path: the ``tokenizer.json`` file.
        add_special_tokens: apply the tokenizer's post-processor (e.g. BOS/EOS templates).
        eos_token: a token (e.g. ``"</s>"``) to append to every document.

    Raises:
        ImportError: the ``tokenizers`` package is not installed.
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a tokenizer.json (named), or ``eos_token`` is not in the vocabulary.
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
        try:
            self._tokenizer = _HFTokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
            raise ValueError(f"tokenizer: {path} is not a Hugging Face tokenizer.json ({e})") from e
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
