"""Preblocked data on disk: a TensorStore ``[N, block_size]`` array or ``chunk*.npy`` matrices.

A store written by ``meshbatch.preblock`` is a directory::

    <root>/preblock.json        the header (block size, marker and pad ids, shuffle level, counts)
    <root>/shard_ledger.json    a Levanter-style ledger: total_num_rows = blocks, is_finished
    <root>/blocks/              zarr v3 int32 [N, block_size], chunks of whole rows (blosc)
    <root>/real_tokens/         zarr v3 int32 [N]: non-pad tokens of each block
    <root>/tokens/              (text inputs) the jagged Levanter token cache of the documents

A ``chunk*.npy`` directory holds ``[rows, block_size]`` integer matrices, read in natural order
(``chunk2`` before ``chunk10``), plus ``preblock.json`` and ``real_tokens.npy`` when our writer made
it. Either is opened as a ``BlockSource``: a flat token space (block ``b`` is tokens
``[b * block_size, (b + 1) * block_size)``) that the pipeline reads coalesced (``prepare_read``),
with O(1) row lookup::

    source = open_blocks("/data/blocks")       # or a directory of chunk*.npy
    source.read_blocks([7, 3])                 # int32 [2, block_size]
    source.real_tokens()                       # int32 [N]
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import posixpath
import re
from typing import Any, Literal

import tensorstore as ts

from meshbatch.arguments import check_int
from meshbatch.cache import shared_context
from meshbatch.cache.format.arrays import kvstore_spec
from meshbatch.cache.format.files import file_exists
from meshbatch.cache.format.ledger import LEDGER_FILE_NAME
from meshbatch.cache.format.stores import is_url, local_path

logger = logging.getLogger(__name__)

HEADER_FILE = "preblock.json"
BLOCKS, REAL_TOKENS = "blocks", "real_tokens"
FORMAT_NAME = "meshbatch.preblock"
Format = Literal["store", "npy", "levanter"]
_CHUNK = re.compile(r"chunk(\d*)(.*)\.(?:npy|pt)$")


@dataclasses.dataclass(frozen=True)
class Header:
    """What ``preblock.json`` records; ``to_dict``/``from_dict`` round-trip it."""

    block_size: int
    num_blocks: int
    doc_id: int
    eod_id: int
    pad_id: int
    vocab_size: int
    shuffle_level: str
    key_data: list[int]
    rule: str
    buffer_docs: int
    escape_literal_markers: bool
    source: dict[str, Any]
    counts: dict[str, int]
    fill: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_NAME, "version": 1, **dataclasses.asdict(self)}

    @property
    def in_vocab_markers(self) -> tuple[str, ...]:
        """Structural ids that are the tokenizer's own marker tokens (allowed inside the vocabulary)."""
        names = self.source.get("tokenizer_markers", ()) if isinstance(self.source, dict) else ()
        return tuple(n for n in names if n in STRUCTURAL_IDS)

    @staticmethod
    def from_dict(raw: dict[str, Any], *, where: str) -> Header:
        """Parses a header, refusing one that is not a JSON object, lacks fields or has bad ids.

        Raises:
            ValueError: named, with ``where``.
        """
        if not isinstance(raw, dict):
            raise ValueError(f"{where} is not a preblock header (a JSON {type(raw).__name__}, not an object)")
        if raw.get("format") != FORMAT_NAME:
            raise ValueError(f"{where} is not a preblock header (format={raw.get('format')!r})")
        names = [f.name for f in dataclasses.fields(Header)]
        missing = [n for n in names if n not in raw]
        if missing:
            raise ValueError(f"{where} lacks {missing}")
        header = Header(**{n: raw[n] for n in names})
        try:
            check_structural_ids(
                {n: getattr(header, n) for n in STRUCTURAL_IDS},
                header.vocab_size,
                in_vocab=header.in_vocab_markers,
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from e
        return header


STRUCTURAL_IDS = ("doc_id", "eod_id", "pad_id")


def check_structural_ids(ids: dict[str, int], vocab_size: int, *, in_vocab=()) -> dict[str, int]:
    """``doc_id``, ``eod_id`` and ``pad_id``: integers, non-negative, distinct, outside the vocabulary.

    A structural id inside ``[0, vocab_size)`` would also be an ordinary token, so blocks would no
    longer parse back to their documents; the only exception is a tokenizer's own marker token
    (``in_vocab`` names those, e.g. a Hugging Face tokenizer with a ``[DOC]`` special token)::

        check_structural_ids({"doc_id": 257, "eod_id": 258, "pad_id": 259}, 257)   # fine
        check_structural_ids({"doc_id": 97, ...}, 257)     # ValueError: doc_id=97 is inside the vocabulary

    Raises:
        TypeError: an id that is not an int.
        ValueError: a negative id, two equal ids, an id inside the vocabulary.
    """
    for name, value in ids.items():
        check_int(name, value, low=0, high=2**31 - 1)
    check_int("vocab_size", vocab_size, low=1, high=2**31 - 1)
    names = list(ids)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if ids[a] == ids[b]:
                raise ValueError(f"{a} and {b} must differ (got {a}={ids[a]}, {b}={ids[b]})")
    for name, value in ids.items():
        if value < vocab_size and name not in in_vocab:
            raise ValueError(
                f"{name}={value} is inside the vocabulary [0, {vocab_size}): a structural id must not be "
                f"an ordinary token (use ids >= vocab_size={vocab_size})"
            )
    return dict(ids)


def tokenizer_markers(sources, ids: dict[str, int]) -> tuple[str, ...]:
    """Structural ids every source's header records as its tokenizer's own marker token, unchanged."""
    headers = [s.header for s in sources]
    if not headers or any(h is None for h in headers):
        return ()
    return tuple(
        n for n in STRUCTURAL_IDS if all(n in h.in_vocab_markers and getattr(h, n) == ids[n] for h in headers)
    )


def check_path(name: str, value) -> str:
    """A path argument as ``str`` (``os.PathLike`` accepted); anything else is a ``TypeError``.
    A ``file://`` URL becomes the local path it names (``file:///data/x`` -> ``/data/x``), so the
    local-file handling (markers, ``npy``, the output-inside-input check) sees one spelling."""
    if isinstance(value, str | os.PathLike) and not isinstance(value, bytes):
        path = os.fspath(value)
        if isinstance(path, str) and path:
            return local_path(path) or path
    raise TypeError(f"{name} must be a path (got {name}={value!r})")


def check_paths(name: str, value) -> list[str]:
    """One path or a list/tuple of them, as a list of ``str``."""
    if isinstance(value, str | os.PathLike):
        return [check_path(name, value)]
    if not isinstance(value, list | tuple):
        raise TypeError(f"{name} must be a path or a list of paths (got {name}={value!r})")
    return [check_path(name, v) for v in value]


def read_header(root: str) -> Header | None:
    """The header of ``root``, or ``None`` where it has none."""
    kvstore = ts.KvStore.open(kvstore_spec(root), context=shared_context()).result()
    found = kvstore.read(HEADER_FILE).result()
    if found.state != "value":
        return None
    where = posixpath.join(root, HEADER_FILE)
    try:
        raw = json.loads(bytes(found.value))
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON: {e}") from e
    return Header.from_dict(raw, where=where)


def write_header(root: str, header: Header) -> None:
    """Writes ``<root>/preblock.json`` atomically (a local path or a URL)."""
    from meshbatch.cache.format.files import write_json_atomic

    write_json_atomic(os.path.join(root, HEADER_FILE), header.to_dict())


def chunk_files(root: str) -> list[str]:
    """``chunk*.npy`` (or ``chunk*.pt``, read with torch) files of ``root`` in natural order
    (``chunk2`` before ``chunk10``)."""
    names = [
        os.path.basename(p) for p in glob.glob(os.path.join(root, "chunk*")) if p.endswith((".npy", ".pt"))
    ]
    matched = [(m, n) for n in names if (m := _CHUNK.match(n))]
    matched.sort(key=lambda mn: (int(mn[0].group(1) or -1), mn[0].group(2), mn[1]))
    return [os.path.join(root, n) for _, n in matched]


def _check_readable(file: str) -> None:
    """Raises, naming ``file``, when a store's ``blocks/zarr.json`` cannot be read."""
    try:
        with open(file, "rb"):
            pass
    except OSError as e:
        raise type(e)(
            e.errno,
            f"{os.path.dirname(file)}/ is a preblocked store's blocks array, but it cannot be read "
            f"({e.strerror})",
            file,
        ) from e


def detect_format(path: str) -> Format:
    """Which layout ``path`` holds: a preblocked store, ``chunk*.npy`` matrices or a jagged cache.

    At an object-store URL (``gs://``, ``s3://``): a store where ``blocks/zarr.json`` exists, else
    a token cache (``chunk*.npy`` matrices are read from local disk only).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        OSError: ``path`` has a ``blocks/`` that cannot be read (named, never taken for a cache).
        ValueError: ``path`` holds none of them.
    """
    path = check_path("path", path)
    if is_url(path):
        return "store" if file_exists(posixpath.join(path, BLOCKS, "zarr.json")) else "levanter"
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no directory at {path=}")
    if os.path.lexists(os.path.join(path, BLOCKS)):
        _check_readable(os.path.join(path, BLOCKS, "zarr.json"))
        return "store"
    if chunk_files(path):
        return "npy"
    if os.path.isfile(os.path.join(path, LEDGER_FILE_NAME)):
        return "levanter"
    raise ValueError(
        f"{path} holds no preblocked store ({BLOCKS}/zarr.json), no chunk*.npy files and no "
        f"token cache ({LEDGER_FILE_NAME})"
    )
