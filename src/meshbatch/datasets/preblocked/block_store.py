"""Preblocked data on disk: a TensorStore ``[N, block_size]`` array or ``chunk*.npy`` matrices.

A store written by ``meshbatch.preblock`` is a directory::

    <root>/preblock.json        the header (block size, marker and pad ids, shuffle level, counts)
    <root>/shard_ledger.json    a Levanter-style ledger: total_num_rows = blocks, is_finished
    <root>/blocks/              zarr v3 int32 [N, block_size], chunks of whole rows (blosc)
    <root>/real_tokens/         zarr v3 int32 [N]: non-pad tokens of each block
    <root>/meshbatch_block_checksums.json   the writer's checksums of both arrays (below)
    <root>/tokens/              (text inputs) the jagged Levanter token cache of the documents

A ``chunk*.npy`` directory holds ``[rows, block_size]`` integer matrices, read in natural order
(``chunk2`` before ``chunk10``), plus ``preblock.json`` and ``real_tokens.npy`` when our writer made
it. Either is opened as a ``BlockSource`` (``block_sources``), a flat token space::

    source = open_blocks("/data/blocks")       # or a directory of chunk*.npy
    source.real_tokens()                       # int32 [N]

The writer sums each stored chunk of both arrays as it writes them (CRC-32 of the int32
little-endian bytes, ``meshbatch.cache.integrity.checksums.chunk_crc``) into a sidecar read before
any block::

    {"format": "meshbatch-block-checksums", "version": 1, "algorithm": "crc32",
     "blocks": 5, "chunk_rows": 2, "block_size": 4, "real_chunk": 8,
     "data": [c0, c1, c2], "real_tokens": [c3]}

    blocks [5, 4] in chunks of 2 rows -> c0 = crc32(rows 0-1), c1 = crc32(rows 2-3), c2 = crc32(row 4)

A reader (``StoreBlocks``) checks a chunk the first time a read touches it (the whole chunk is read
in the same batch) and remembers it; ``real_tokens`` are checked when loaded. So a token changed
after the writer finished, even one rewritten through TensorStore (which keeps the ``crc32c``
codec valid), is a ``CacheIntegrityError`` naming the store, the chunk and its blocks.
``MESHBATCH_VERIFY_READS=0`` turns the checks off, as for caches.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import posixpath
import re
import threading
from typing import Any, Literal

import numpy as np
import tensorstore as ts

from meshbatch.arguments import check_int, check_token_id
from meshbatch.cache import CacheIntegrityError, shared_context
from meshbatch.cache.format.files import file_exists, write_json_atomic
from meshbatch.cache.format.ledger import LEDGER_FILE_NAME
from meshbatch.cache.format.stores import is_url, kvstore_spec, local_path
from meshbatch.cache.integrity.checksums import chunk_crc

logger = logging.getLogger(__name__)

HEADER_FILE = "preblock.json"
BLOCKS, REAL_TOKENS = "blocks", "real_tokens"
FORMAT_NAME = "meshbatch.preblock"
Format = Literal["store", "npy", "levanter"]
_CHUNK = re.compile(r"chunk(\d*)(.*)\.(?:npy|pt)$")
SIDECAR = "meshbatch_block_checksums.json"
SIDECAR_FORMAT, SIDECAR_VERSION = "meshbatch-block-checksums", 1


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


def resolve_ids(sources, given: dict) -> dict[str, int]:
    """The structural ids and ``vocab_size``: each given one, else the one every source's header
    records, checked by ``check_structural_ids`` (a structural id inside the vocabulary only where
    every header records it as its tokenizer's own marker token, unchanged).

    Raises:
        ValueError: an id not given that the headers do not agree on, or a bad id.
    """
    ids = {}
    for name, value in given.items():
        found = {getattr(s.header, name) for s in sources if s.header is not None}
        if value is None:
            if len(found) != 1 or any(s.header is None for s in sources):
                reason = f"the headers give {sorted(found)}" if found else "the data has no preblock header"
                raise ValueError(f"{name} is needed: {reason}")
            value = found.pop()
        ids[name] = check_token_id(name, value)
    headers = [s.header for s in sources]
    in_vocab = ()
    if headers and all(h is not None for h in headers):
        in_vocab = tuple(
            n
            for n in STRUCTURAL_IDS
            if all(n in h.in_vocab_markers and getattr(h, n) == ids[n] for h in headers)
        )
    check_structural_ids({n: ids[n] for n in STRUCTURAL_IDS}, ids["vocab_size"], in_vocab=in_vocab)
    return ids


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


def _read_json(root: str, name: str, error: type[Exception]) -> tuple[Any, str] | None:
    """``(the JSON of <root>/<name>, its path)``, or ``None`` where there is no such file; bad JSON
    is an ``error`` naming the file."""
    kvstore = ts.KvStore.open(kvstore_spec(root), context=shared_context()).result()
    found = kvstore.read(name).result()
    if found.state != "value":
        return None
    where = posixpath.join(root, name)
    try:
        return json.loads(bytes(found.value)), where
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{where} is not valid JSON: {e}") from e


def read_header(root: str) -> Header | None:
    """The header of ``root``, or ``None`` where it has none."""
    found = _read_json(root, HEADER_FILE, ValueError)
    return None if found is None else Header.from_dict(found[0], where=found[1])


def write_header(root: str, header: Header) -> None:
    """Writes ``<root>/preblock.json`` atomically (a local path or a URL)."""
    write_json_atomic(os.path.join(root, HEADER_FILE), header.to_dict())


def chunk_sums(values: np.ndarray, chunk: int) -> list[int]:
    """CRC-32 of each ``chunk`` leading-axis slice of ``values``."""
    return [chunk_crc(values[i : i + chunk]) for i in range(0, values.shape[0], chunk)]


def write_sidecar(root: str, *, blocks: int, block_size: int, chunk_rows: int, real_chunk: int, data, real):
    """Writes ``<root>/meshbatch_block_checksums.json`` atomically (a local path or a URL)."""
    record = {
        "format": SIDECAR_FORMAT,
        "version": SIDECAR_VERSION,
        "algorithm": "crc32",
        "blocks": blocks,
        "block_size": block_size,
        "chunk_rows": chunk_rows,
        "real_chunk": real_chunk,
        "data": list(data),
        "real_tokens": list(real),
    }
    write_json_atomic(posixpath.join(root, SIDECAR), record)


def chunk_files(root: str) -> list[str]:
    """``chunk*.npy`` (or ``chunk*.pt``, read with torch) files of ``root`` in natural order
    (``chunk2`` before ``chunk10``)."""
    names = [
        os.path.basename(p) for p in glob.glob(os.path.join(root, "chunk*")) if p.endswith((".npy", ".pt"))
    ]
    matched = [(m, n) for n in names if (m := _CHUNK.match(n))]
    matched.sort(key=lambda mn: (int(mn[0].group(1) or -1), mn[0].group(2), mn[1]))
    return [os.path.join(root, n) for _, n in matched]


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
        file = os.path.join(path, BLOCKS, "zarr.json")
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
        return "store"
    if chunk_files(path):
        return "npy"
    if os.path.isfile(os.path.join(path, LEDGER_FILE_NAME)):
        return "levanter"
    raise ValueError(
        f"{path} holds no preblocked store ({BLOCKS}/zarr.json), no chunk*.npy files and no "
        f"token cache ({LEDGER_FILE_NAME})"
    )


class BlockVerifier:
    """The recorded sums of one store and the chunks verified so far (thread-safe)."""

    def __init__(self, root: str, record: dict):
        self.root = root
        self.blocks = record["blocks"]
        self.chunk_rows, self.real_chunk = record["chunk_rows"], record["real_chunk"]
        self.data, self.real = record["data"], record["real_tokens"]
        self._verified: set[int] = set()
        self._lock = threading.Lock()

    def pending(self, rows: np.ndarray) -> list[int]:
        """Chunks holding ``rows`` that are not verified yet (none, at once, once all are)."""
        if len(self._verified) == len(self.data):
            return []
        chunks = np.unique(np.asarray(rows, np.int64) // self.chunk_rows).tolist()
        with self._lock:
            return [c for c in chunks if c not in self._verified]

    def rows(self, chunk: int) -> tuple[int, int]:
        return chunk * self.chunk_rows, min((chunk + 1) * self.chunk_rows, self.blocks)

    def check(self, chunk: int, values: np.ndarray) -> None:
        found = chunk_crc(values)
        if found != self.data[chunk]:
            raise self._mismatch(BLOCKS, chunk, *self.rows(chunk), self.data[chunk], found)
        with self._lock:
            self._verified.add(chunk)

    def check_real(self, real: np.ndarray) -> None:
        for k, found in enumerate(chunk_sums(real, self.real_chunk)):
            if found != self.real[k]:
                hi = min((k + 1) * self.real_chunk, real.shape[0])
                raise self._mismatch(REAL_TOKENS, k, k * self.real_chunk, hi, self.real[k], found)

    def _mismatch(
        self, array: str, k: int, lo: int, hi: int, recorded: int, found: int
    ) -> CacheIntegrityError:
        return CacheIntegrityError(
            f"{posixpath.join(self.root, array)}: chunk {k} (blocks [{lo}, {hi})) fails its checksum: "
            f"the writer recorded crc32 {recorded:#010x}, it now sums to {found:#010x}"
        )


def read_verifier(root: str, *, blocks: int, block_size: int) -> BlockVerifier | None:
    """The store's verifier, or None where it has no sidecar.

    Raises:
        CacheIntegrityError: a sidecar that is malformed or records another shape.
    """
    found = _read_json(root, SIDECAR, CacheIntegrityError)
    if found is None:
        return None
    record, where = found
    ints = ("blocks", "block_size", "chunk_rows", "real_chunk")
    ok = (
        isinstance(record, dict)
        and record.get("format") == SIDECAR_FORMAT
        and record.get("version") == SIDECAR_VERSION
        and all(type(record.get(k)) is int and record[k] > 0 for k in ints)
        and all(
            isinstance(record.get(k), list) and all(type(v) is int and 0 <= v < 2**32 for v in record[k])
            for k in ("data", "real_tokens")
        )
    )
    if not ok:
        raise CacheIntegrityError(f"{where} is not a meshbatch block checksum file")
    if (record["blocks"], record["block_size"]) != (blocks, block_size):
        raise CacheIntegrityError(
            f"{where} records [{record['blocks']}, {record['block_size']}] blocks; the store holds "
            f"[{blocks}, {block_size}]"
        )
    counts = {"data": -(-blocks // record["chunk_rows"]), "real_tokens": -(-blocks // record["real_chunk"])}
    for key, n in counts.items():
        if len(record[key]) != n:
            raise CacheIntegrityError(f"{where}: {len(record[key])} {key} checksums for {n} chunks")
    return BlockVerifier(root, record)
