"""Per-chunk checksums of a cache field, in a sidecar file that Levanter ignores.

meshbatch's writer records a CRC-32 of every ``chunk_elements``-element chunk of both arrays of a
field, computed from the values it wrote (little-endian bytes of the on-disk dtype), so
``validate-cache --deep`` finds a flipped byte that still decodes::

    <root>/input_ids/meshbatch_checksums.json
    {"format": "meshbatch-checksums", "version": 1, "algorithm": "crc32", "chunk_elements": 4,
     "dtype": "int32", "rows": 2, "tokens": 6, "data": [c0, c1], "offsets": [c2]}

    rows [5, 6, 7, 8], [9, 9] with chunk_elements = 4
    data    = [5, 6, 7, 8 | 9, 9]  -> c0 = crc32(int32 LE of [5, 6, 7, 8]), c1 = crc32(... [9, 9])
    offsets = [2, 4, 6]            -> c2 = crc32(int64 LE of [2, 4, 6])   (offsets[0] = row count)

A chunk's checksum covers only the elements written (``tokens`` of data, ``rows + 1`` of offsets).
The writer rewrites the file at every commit, before the ledger, so a committed ledger never
outruns its checksums.
"""

from __future__ import annotations

import json
import posixpath
import zlib
from dataclasses import dataclass

import numpy as np
import tensorstore as ts

from meshbatch.cache.format.checks import CacheIntegrityError
from meshbatch.cache.format.ledger import LEDGER_FILE_NAME
from meshbatch.cache.format.stores import open_kvstore

SIDECAR_FILE_NAME = "meshbatch_checksums.json"
FORMAT, VERSION, ALGORITHM = "meshbatch-checksums", 1, "crc32"


try:  # ISA-L's CRC-32 is zlib's, computed with carry-less multiply (about 13x faster)
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values
    _crc32 = zlib.crc32


def chunk_crc(values: np.ndarray) -> int:
    """CRC-32 (zlib's) of ``values``' little-endian bytes."""
    little = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    return _crc32(little.view(np.uint8))


def checksum_mismatch(values: np.ndarray, recorded, k: int, *, lo: int, where: str, head=None) -> str | None:
    """Why chunk ``k`` (``values``: its elements from ``lo``, as on disk) fails the CRC-32 its
    writer recorded (``recorded[k]``), or None when it matches or nothing is recorded. ``head``:
    the value element 0 is summed as (offsets chunk 0: the row count its writer summed, which
    ``offsets[0]`` may be ahead of)."""
    if recorded is None:
        return None
    if head is not None:
        values = np.concatenate([np.array([head], np.int64), values[1:]])
    found = chunk_crc(values)
    if found == recorded[k]:
        return None
    return (
        f"{where}: chunk {k} (elements [{lo}, {lo + values.shape[0]})) fails its checksum: the writer "
        f"recorded crc32 {recorded[k]:#010x}, the chunk now sums to {found:#010x}"
    )


@dataclass(frozen=True)
class Checksums:
    """The parsed sidecar of one field (see the module docstring)."""

    chunk_elements: int
    dtype: np.dtype
    rows: int
    tokens: int
    data: tuple[int, ...]
    offsets: tuple[int, ...]

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "algorithm": ALGORITHM,
            "chunk_elements": self.chunk_elements,
            "dtype": self.dtype.name,
            "rows": self.rows,
            "tokens": self.tokens,
            "data": list(self.data),
            "offsets": list(self.offsets),
        }

    @staticmethod
    def from_dict(raw, *, where: str) -> Checksums:
        """Parses a sidecar dict, refusing anything malformed by name (``CacheIntegrityError``)."""
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise CacheIntegrityError(f"{where} is not a meshbatch checksum file")
        if raw.get("version") != VERSION or raw.get("algorithm") != ALGORITHM:
            raise CacheIntegrityError(
                f"{where} has version={raw.get('version')!r}, algorithm={raw.get('algorithm')!r}; "
                f"expected {VERSION}, {ALGORITHM!r}"
            )
        counts = {}
        for key in ("chunk_elements", "rows", "tokens"):
            value = raw.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < (key == "chunk_elements"):
                raise CacheIntegrityError(f"{where}: {key} must be a non-negative integer (got {value!r})")
            counts[key] = value
        lists = {}
        for key in ("data", "offsets"):
            value = raw.get(key)
            ok = isinstance(value, list) and all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in value
            )
            if not ok:
                raise CacheIntegrityError(f"{where}: {key} must be a list of CRC-32 values")
            lists[key] = tuple(value)
        try:
            dtype = np.dtype(raw.get("dtype"))
        except (TypeError, ValueError, OverflowError, RecursionError) as e:  # numpy's refusals vary
            raise CacheIntegrityError(
                f"{where}: dtype={raw.get('dtype')!r} is not a numpy dtype ({type(e).__name__}: {e})"
            ) from e
        chunk = counts["chunk_elements"]
        expected = {"data": -(-counts["tokens"] // chunk), "offsets": -(-(counts["rows"] + 1) // chunk)}
        for key, n in expected.items():
            if len(lists[key]) != n:
                raise CacheIntegrityError(
                    f"{where}: {len(lists[key])} {key} checksums for {n} chunks "
                    f"({counts['rows']} rows, {counts['tokens']} tokens, {chunk} per chunk)"
                )
        return Checksums(chunk, dtype, counts["rows"], counts["tokens"], lists["data"], lists["offsets"])


def sidecar_path(field_root: str) -> str:
    return posixpath.join(field_root, SIDECAR_FILE_NAME)


def check_sidecar(
    field_root: str,
    *,
    rows: int,
    tokens: int,
    finished: bool,
    dtype: np.dtype,
    required: bool = False,
    context: ts.Context | None = None,
) -> Checksums | None:
    """The field's checksum sidecar, checked against what the ledger and offsets say (no chunk read).

    An unfinished cache's sidecar may be ahead of its ledger (it is written first), never behind.
    A part whose ledger says ``meshbatch_checksums: true`` (``required``) was written by
    ``CacheWriter``, which commits the sidecar before every ledger: for it a missing sidecar is damage
    (deleted checksums), not a cache without checksums::

        ledger {"meshbatch_checksums": true, ...}, no sidecar   -> CacheIntegrityError naming both files
        ledger without the key (Levanter's), no sidecar         -> None: read without checksums

    Raises:
        CacheIntegrityError: the sidecar is missing though ``required``, is malformed, records
            another dtype (``data_type`` edited in ``zarr.json``), or other row and token counts
            (offsets moved past the data written).
    """
    kvstore = open_kvstore(field_root, context=context)
    found = kvstore.read(SIDECAR_FILE_NAME).result()
    where = sidecar_path(field_root)
    if found.state != "value":
        if not required:
            return None  # no sidecar: a Levanter cache
        ledger = posixpath.join(posixpath.dirname(field_root), LEDGER_FILE_NAME)
        raise CacheIntegrityError(
            f"{where} is missing, but the ledger {ledger} says meshbatch_checksums=true: its writer "
            "wrote the checksums with every commit, so they were deleted (or the cache is being "
            "overwritten); its tokens cannot be verified: rebuild it"
        )
    try:
        raw = json.loads(bytes(found.value))
    except (ValueError, RecursionError) as e:  # bad JSON or UTF-8, a >4300-digit integer, deep nesting
        raise CacheIntegrityError(f"{where} is not valid JSON: {type(e).__name__}: {e}") from e
    sums = Checksums.from_dict(raw, where=where)
    if sums.dtype != np.dtype(dtype):
        raise CacheIntegrityError(
            f"{field_root}/data has dtype {np.dtype(dtype)}, but {where} records that its writer wrote "
            f"{sums.dtype}"
        )
    if sums.rows < rows or sums.tokens < tokens or (finished and (sums.rows, sums.tokens) != (rows, tokens)):
        raise CacheIntegrityError(
            f"{where} records {sums.rows} rows and {sums.tokens} tokens written, but the ledger and offsets "
            f"say {rows} rows and {tokens} tokens"
        )
    return sums


class RunningChecksums:
    """Checksums of an append-only sequence of ``dtype`` values, ``chunk`` at a time: full chunks are
    final (``done``: the sums of those already written), the ``tail`` after them is not."""

    def __init__(self, chunk: int, dtype: np.dtype, done: list[int], tail: np.ndarray):
        self.chunk, self.dtype = chunk, np.dtype(dtype)
        self.done = list(done)
        self._tail = [np.asarray(tail, dtype=self.dtype)]
        self._tail_size = int(self._tail[0].size)

    def append(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=self.dtype)
        while values.size:
            take = min(self.chunk - self._tail_size, values.size)
            self._tail.append(values[:take])
            self._tail_size += take
            values = values[take:]
            if self._tail_size == self.chunk:
                self.done.append(chunk_crc(np.concatenate(self._tail)))
                self._tail, self._tail_size = [], 0

    def digests(self) -> list[int]:
        """Checksums of every chunk, the partial tail last."""
        if not self._tail_size:
            return list(self.done)
        return [*self.done, chunk_crc(np.concatenate(self._tail))]


class OffsetsChecksums:
    """``RunningChecksums`` of an offsets array, whose element 0 (the row count) changes every commit.

    Chunk 0 is kept in memory (at most ``chunk`` int64 values) and summed with the current count.
    """

    def __init__(self, chunk: int, head: np.ndarray, rest: RunningChecksums):
        self.chunk = chunk
        self._head = [np.asarray(head, dtype=np.int64)]  # offsets[1 : chunk]
        self._head_size = int(self._head[0].size)
        self.rest = rest  # offsets[chunk:]

    def append(self, ends: np.ndarray) -> None:
        ends = np.asarray(ends, dtype=np.int64)
        take = min(self.chunk - 1 - self._head_size, ends.size)
        if take:
            self._head.append(ends[:take])
            self._head_size += take
        self.rest.append(ends[take:])

    def digests(self, rows: int) -> list[int]:
        head = np.concatenate([np.array([rows], dtype=np.int64), *self._head])
        return [chunk_crc(head), *self.rest.digests()]
