"""Checksums of a preblocked store, recorded by its writer and verified on read (like token caches').

The writer sums each stored chunk of both arrays as it writes them (CRC-32 of the int32
little-endian bytes, ``meshbatch.cache.integrity.checksums.chunk_crc``) into a sidecar read before any block::

    <root>/meshbatch_block_checksums.json
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

import json
import posixpath
import threading

import numpy as np
import tensorstore as ts

from meshbatch.cache import CacheIntegrityError, shared_context
from meshbatch.cache.format.arrays import kvstore_spec
from meshbatch.cache.format.files import write_json_atomic
from meshbatch.cache.integrity.checksums import chunk_crc

SIDECAR = "meshbatch_block_checksums.json"
FORMAT, VERSION = "meshbatch-block-checksums", 1


def chunk_sums(values: np.ndarray, chunk: int) -> list[int]:
    """CRC-32 of each ``chunk`` leading-axis slice of ``values``."""
    return [chunk_crc(values[i : i + chunk]) for i in range(0, values.shape[0], chunk)]


def write_sidecar(root: str, *, blocks: int, block_size: int, chunk_rows: int, real_chunk: int, data, real):
    """Writes ``<root>/meshbatch_block_checksums.json`` atomically (a local path or a URL)."""
    record = {
        "format": FORMAT,
        "version": VERSION,
        "algorithm": "crc32",
        "blocks": blocks,
        "block_size": block_size,
        "chunk_rows": chunk_rows,
        "real_chunk": real_chunk,
        "data": list(data),
        "real_tokens": list(real),
    }
    write_json_atomic(posixpath.join(root, SIDECAR), record)


class BlockVerifier:
    """The recorded sums of one store and the chunks verified so far (thread-safe)."""

    def __init__(self, root: str, record: dict):
        self.root = root
        self.blocks, self.chunk_rows, self.real_chunk = (
            record["blocks"],
            record["chunk_rows"],
            record["real_chunk"],
        )
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
            lo, hi = self.rows(chunk)
            raise CacheIntegrityError(
                f"{posixpath.join(self.root, 'blocks')}: chunk {chunk} (blocks [{lo}, {hi})) fails its "
                f"checksum: the writer recorded crc32 {self.data[chunk]:#010x}, it now sums to {found:#010x}"
            )
        with self._lock:
            self._verified.add(chunk)

    def check_real(self, real: np.ndarray) -> None:
        for k, found in enumerate(chunk_sums(real, self.real_chunk)):
            if found != self.real[k]:
                lo, hi = k * self.real_chunk, min((k + 1) * self.real_chunk, real.shape[0])
                raise CacheIntegrityError(
                    f"{posixpath.join(self.root, 'real_tokens')}: chunk {k} (blocks [{lo}, {hi})) fails its "
                    f"checksum: the writer recorded crc32 {self.real[k]:#010x}, it now sums to {found:#010x}"
                )


def read_verifier(root: str, *, blocks: int, block_size: int) -> BlockVerifier | None:
    """The store's verifier, or None where it has no sidecar (written before checksums existed).

    Raises:
        CacheIntegrityError: a sidecar that is malformed or records another shape.
    """
    kvstore = ts.KvStore.open(kvstore_spec(root), context=shared_context()).result()
    found = kvstore.read(SIDECAR).result()
    if found.state != "value":
        return None
    where = posixpath.join(root, SIDECAR)
    try:
        record = json.loads(bytes(found.value))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CacheIntegrityError(f"{where} is not valid JSON: {e}") from e
    ints = ("blocks", "block_size", "chunk_rows", "real_chunk")
    ok = (
        isinstance(record, dict)
        and record.get("format") == FORMAT
        and record.get("version") == VERSION
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
