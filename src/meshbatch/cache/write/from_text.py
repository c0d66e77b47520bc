"""Building a token cache from text and JSONL files: read, tokenize, write, resumably.

Documents come from the inputs in order: a ``.jsonl`` line is one document (its ``text_key`` field);
a text file is one document, or one per non-empty line with ``text_docs="line"``. ``.gz`` files are
decompressed. Run twice, the build resumes: documents the ledger already commits are read but not
tokenized again::

    build_cache("/data/cache", ["a.jsonl", "b.txt"])    # killed after 1200 documents
    build_cache("/data/cache", ["a.jsonl", "b.txt"])    # skips 1200, writes the rest, finishes

The ledger records each input's path, size and SHA-256, and the tokenizer, so a resume over an
input whose bytes changed (even at the same size) is refused rather than mixing two corpora.
Text must be UTF-8; a file that is not is named with the first bad byte's offset and line.

Tokenizers: the built-in ``ByteTokenizer`` needs no files (a token is a UTF-8 byte, and 256 ends a
document); ``HFTokenizer`` loads a local ``tokenizer.json`` with the ``tokenizers`` package
(imported only when one is built)::

    ByteTokenizer().encode_batch(["hé"]) -> [array([104, 195, 169, 256])]

Both report ``metadata()``, which the ledger records so that a resumed build cannot silently
switch tokenizers.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import zlib
from collections.abc import Iterator, Sequence
from typing import IO, Any, Literal, Protocol

import numpy as np
from tqdm.auto import tqdm

from meshbatch.arguments import check_choice, check_int
from meshbatch.cache.format.checks import as_token_dtype, check_component, check_name, check_path
from meshbatch.cache.format.ledger import Ledger, ledger_metadata, try_read_ledger
from meshbatch.cache.write.writer import DEFAULT_FLUSH_TOKENS, CacheWriter, IfExists

logger = logging.getLogger(__name__)

TextDocs = Literal["file", "line"]


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


def iter_documents(
    paths: Sequence[str], *, text_key: str = "text", text_docs: TextDocs = "file"
) -> Iterator[str]:
    """Yields the documents of ``paths`` in order (see the module docstring).

    Raises:
        ValueError: a JSONL line that is not a JSON object with a string ``text_key`` (named by file
            and line number), text that is not UTF-8 (named by file, byte offset and line), or an
            unknown ``text_docs``.
    """
    paths = _check_inputs(paths)
    check_choice("text_docs", text_docs, TextDocs)
    for path in paths:
        try:
            with _open_text(path) as f:
                if _is_jsonl(path):
                    for lineno, line in enumerate(f, start=1):
                        if line.strip():
                            yield _jsonl_text(line, text_key, where=f"{path}:{lineno}")
                elif text_docs == "file":
                    yield f.read()
                else:
                    yield from (line.rstrip("\r\n") for line in f if line.strip())
        except UnicodeDecodeError as e:
            raise ValueError(_not_utf8(path, e)) from e
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            if not path.endswith(".gz"):
                raise
            raise ValueError(f"inputs: {path} is not a complete gzip file: {type(e).__name__}: {e}") from e


def build_cache(
    output: str,
    inputs: Sequence[str],
    *,
    tokenizer: Tokenizer | None = None,
    field: str = "input_ids",
    dtype: np.dtype | str = "int32",
    text_key: str = "text",
    text_docs: TextDocs = "file",
    if_exists: IfExists = "resume",
    batch_docs: int = 256,
    flush_tokens: int = DEFAULT_FLUSH_TOKENS,
    progress: bool | None = None,
) -> Ledger:
    """Tokenizes ``inputs`` into a finished cache at ``output``.

    Args:
        output: cache root (local path).
        inputs: text / JSONL files (optionally ``.gz``), read in this order.
        tokenizer: defaults to ``ByteTokenizer()``.
        dtype: token dtype on disk; every id of the tokenizer's vocabulary must fit.
        text_key: the JSONL field holding a document's text.
        text_docs: a text file is one document (``"file"``) or one per non-empty line (``"line"``).
        if_exists: ``"resume"`` (default: continue a killed build of the same inputs and tokenizer;
            a finished one is returned as is), ``"error"`` or ``"overwrite"``.
        batch_docs: documents tokenized per call.
        progress: show a tqdm bar; ``None`` shows it only on a terminal.

    Returns:
        The finished ledger.

    Raises:
        TypeError, ValueError: a bad argument, named (``dtype="float32"``, ``inputs="a.txt"``).
        FileNotFoundError: an input is missing.
        ValueError: resuming over changed inputs or another tokenizer; undecodable text.
    """
    output, inputs = check_path("output", output), _check_inputs(inputs)
    if tokenizer is not None and not all(
        hasattr(tokenizer, a) for a in ("encode_batch", "vocab_size", "metadata")
    ):
        raise TypeError(f"tokenizer must provide encode_batch, vocab_size and metadata (got {tokenizer!r})")
    check_component("field", field)
    check_name("text_key", text_key)
    check_choice("text_docs", text_docs, TextDocs)
    check_choice("if_exists", if_exists, IfExists)
    check_int("batch_docs", batch_docs, low=1)
    check_int("flush_tokens", flush_tokens, low=1)
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool or None (got {progress=})")
    dtype = as_token_dtype("dtype", dtype)
    tokenizer = tokenizer or ByteTokenizer()
    if np.iinfo(dtype).max < tokenizer.vocab_size - 1:
        raise ValueError(f"dtype={dtype} cannot hold token ids up to {tokenizer.vocab_size - 1}")
    missing = [p for p in inputs if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"input files not found: {missing}")
    disable = None if progress is None else not progress  # tqdm: None = off unless a terminal
    metadata = {
        "tokenizer": tokenizer.metadata(),
        "inputs": [_describe_input(p, disable=disable) for p in inputs],
        "text_key": text_key,
        "text_docs": text_docs,
    }
    if if_exists == "resume":
        done = try_read_ledger(output)
        if done is not None:
            _check_same_inputs(output, done.metadata.get("preprocessor_metadata"), metadata)
        if done is not None and done.is_finished and dict(done.metadata) == ledger_metadata(metadata):
            logger.info("cache %s is already built (%d rows)", output, done.total_num_rows)
            return done

    with CacheWriter(
        output, field=field, dtype=dtype, if_exists=if_exists, metadata=metadata, flush_tokens=flush_tokens
    ) as writer:
        skip = writer.num_rows
        if skip:
            logger.info("resuming %s after %d committed documents", output, skip)
        batch: list[str] = []
        bar = tqdm(desc=f"building {output}", unit="doc", initial=skip, disable=disable)
        for i, text in enumerate(iter_documents(inputs, text_key=text_key, text_docs=text_docs)):
            if i < skip:
                continue
            batch.append(text)
            if len(batch) == batch_docs:
                writer.write(tokenizer.encode_batch(batch))
                bar.update(len(batch))
                batch = []
        if batch:
            writer.write(tokenizer.encode_batch(batch))
            bar.update(len(batch))
        bar.close()
        return writer.finish()


def _is_jsonl(path: str) -> bool:
    return path.removesuffix(".gz").endswith((".jsonl", ".ndjson"))


def _open_text(path: str) -> IO[str]:
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _jsonl_text(line: str, text_key: str, *, where: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from e
    if not isinstance(record, dict) or not isinstance(record.get(text_key), str):
        raise ValueError(f"{where}: expected a JSON object with a string {text_key!r} field")
    text = record[text_key]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # "\ud800" escapes a lone surrogate: valid JSON, not text
        raise ValueError(
            f"{where}: the {text_key!r} field holds a lone surrogate {text[e.start]!r} at character "
            f"{e.start}: not encodable as UTF-8 text"
        ) from e
    return text


def _check_inputs(paths) -> list[str]:
    if isinstance(paths, str | bytes | os.PathLike) or not isinstance(paths, Sequence):
        raise TypeError(f"inputs must be a list of file paths (got {paths!r:.80}); wrap one path in a list")
    return [check_path(f"inputs[{i}]", p) for i, p in enumerate(paths)]


def _check_same_inputs(output: str, recorded, metadata: dict) -> None:
    """Refuses to resume a build whose inputs changed, naming the first input that did."""
    before = recorded.get("inputs") if isinstance(recorded, dict) else None
    if not isinstance(before, list):
        return  # not a build_cache cache: CacheWriter's metadata check decides
    now = metadata["inputs"]
    if [i.get("path") if isinstance(i, dict) else i for i in before] != [i["path"] for i in now]:
        raise ValueError(
            f"cannot resume {output}: it was built from inputs {[i.get('path') for i in before]}, "
            f"not {[i['path'] for i in now]}; pass if_exists='overwrite' to rebuild"
        )
    for old, new in zip(before, now, strict=True):
        if old != new:
            raise ValueError(
                f"cannot resume {output}: input {new['path']} changed since the build began "
                f"({old.get('bytes')} -> {new['bytes']} bytes, "
                f"sha256 {old.get('sha256')} -> {new['sha256']}); pass if_exists='overwrite' to rebuild"
            )


def _describe_input(path: str, *, disable: bool | None) -> dict:
    """Path, size and SHA-256 of an input: what a resume must find unchanged."""
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with (
        open(path, "rb") as f,
        tqdm(total=size, unit="B", unit_scale=True, desc=f"hashing {path}", disable=disable) as bar,
    ):
        while block := f.read(1 << 23):
            digest.update(block)
            bar.update(len(block))
    return {"path": os.path.abspath(path), "bytes": size, "sha256": digest.hexdigest()}


def _not_utf8(path: str, error: UnicodeDecodeError) -> str:
    """Names the first byte of ``path`` that is not UTF-8, by offset and line (a slow path: errors only)."""
    opener = gzip.open if path.endswith(".gz") else open
    offset = 0
    with opener(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):  # b"\n" never occurs inside a UTF-8 sequence
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                bad = line[e.start]
                unzipped = " of the decompressed text" if opener is not open else ""
                where = f"byte offset {offset + e.start}{unzipped}"
                return f"{path}: not UTF-8 text: byte 0x{bad:02x} at {where} (line {lineno}): {e.reason}"
            offset += len(line)
    return f"{path}: not UTF-8 text: {error}"
