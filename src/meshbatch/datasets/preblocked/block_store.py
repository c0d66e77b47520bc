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

from meshbatch.cache import shared_context
from meshbatch.cache.arrays import kvstore_spec
from meshbatch.cache.ledger import LEDGER_FILE_NAME

logger = logging.getLogger(__name__)

HEADER_FILE = "preblock.json"
BLOCKS, REAL_TOKENS = "blocks", "real_tokens"
FORMAT_NAME = "meshbatch.preblock"
Format = Literal["store", "npy", "levanter"]
_CHUNK = re.compile(r"chunk(\d*)(.*)\.npy$")


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

    @staticmethod
    def from_dict(raw: dict[str, Any], *, where: str) -> Header:
        if raw.get("format") != FORMAT_NAME:
            raise ValueError(f"{where} is not a preblock header (format={raw.get('format')!r})")
        names = [f.name for f in dataclasses.fields(Header)]
        missing = [n for n in names if n not in raw]
        if missing:
            raise ValueError(f"{where} lacks {missing}")
        return Header(**{n: raw[n] for n in names})


def check_path(name: str, value) -> str:
    """A path argument as ``str`` (``os.PathLike`` accepted); anything else is a ``TypeError``."""
    if isinstance(value, str | os.PathLike) and not isinstance(value, bytes):
        path = os.fspath(value)
        if isinstance(path, str) and path:
            return path
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
    """Writes ``<root>/preblock.json`` (local paths) atomically."""
    path = os.path.join(root, HEADER_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(header.to_dict(), f, indent=1)
    os.replace(path + ".tmp", path)


def chunk_files(root: str) -> list[str]:
    """``chunk*.npy`` files of ``root`` in natural order (``chunk2`` before ``chunk10``)."""
    names = [os.path.basename(p) for p in glob.glob(os.path.join(root, "chunk*.npy"))]
    matched = [(m, n) for n in names if (m := _CHUNK.match(n))]
    matched.sort(key=lambda mn: (int(mn[0].group(1) or -1), mn[0].group(2), mn[1]))
    return [os.path.join(root, n) for _, n in matched]


def detect_format(path: str) -> Format:
    """Which layout ``path`` holds: a preblocked store, ``chunk*.npy`` matrices or a jagged cache.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` holds none of them.
    """
    path = check_path("path", path)
    if "://" not in path and not os.path.isdir(path):
        raise FileNotFoundError(f"no directory at {path=}")
    local = "://" not in path
    if local and os.path.isfile(os.path.join(path, BLOCKS, "zarr.json")):
        return "store"
    if local and chunk_files(path):
        return "npy"
    if not local or os.path.isfile(os.path.join(path, LEDGER_FILE_NAME)):
        return "levanter"
    raise ValueError(
        f"{path} holds no preblocked store ({BLOCKS}/zarr.json), no chunk*.npy files and no "
        f"token cache ({LEDGER_FILE_NAME})"
    )
