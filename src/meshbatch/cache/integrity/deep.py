"""``validate-cache --deep``: read every chunk of a cache, check it decodes and matches its checksum.

A cache is one or more *parts* (the consolidated cache itself, or each shard of a sharded one).
For each part, both arrays are read front to back in checksum-sized chunks, a window of reads in
flight, with a progress bar over bytes::

    part /c (rows 3, tokens 6), sidecar chunk_elements = 4
    offsets [3, 2, 3, 6]  -> chunk 0 decodes; crc32 == sidecar.offsets[0]?
    data    [5, 6, 7, 8 | 9, 9] -> chunks 0, 1 decode; crc32 == sidecar.data[0], [1]?

A chunk that is missing or does not decode, or whose CRC-32 differs from the one meshbatch's
writer recorded, is a ``CacheIntegrityError`` naming the part, array, chunk and token range. A
cache without a sidecar (written by Levanter) gets every check but the checksums.
"""

from __future__ import annotations

import collections
import posixpath
import time
from dataclasses import dataclass

import numpy as np
import tensorstore as ts
from tqdm.auto import tqdm

from meshbatch.cache.format.arrays import DEFAULT_CHUNK_SIZE, open_field
from meshbatch.cache.format.checks import CacheIntegrityError
from meshbatch.cache.integrity.checksums import Checksums, check_sidecar, chunk_crc

READS_IN_FLIGHT = 8


@dataclass(frozen=True)
class Part:
    """One consolidated cache directory of a cache, with what its ledger commits."""

    root: str
    rows: int
    tokens: int
    finished: bool


@dataclass(frozen=True)
class DeepResult:
    chunks: int
    nbytes: int
    seconds: float
    checksummed_chunks: int


def part_sidecar(part: Part, field: str, dtype: np.dtype) -> Checksums | None:
    """``check_sidecar`` for one part."""
    field_root = posixpath.join(part.root, field)
    return check_sidecar(field_root, rows=part.rows, tokens=part.tokens, finished=part.finished, dtype=dtype)


def verify_parts(
    parts: list[tuple[Part, Checksums | None]], field: str, *, progress: bool | None = None
) -> DeepResult:
    """Reads every chunk of every part (see the module docstring).

    Args:
        parts: each part with its checked sidecar (or None).
        field: the field read.
        progress: show a tqdm bar over bytes; ``None`` shows it only on a terminal.
    """
    start = time.perf_counter()
    context = ts.Context({"cache_pool": {"total_bytes_limit": 0}})  # decode from disk, cache nothing
    arrays = [open_field(part.root, field, context=context) for part, _ in parts]
    itemsizes = [np.dtype(a.data.dtype.numpy_dtype).itemsize for a in arrays]
    total = sum(p.tokens * size + (p.rows + 1) * 8 for (p, _), size in zip(parts, itemsizes, strict=True))
    disable = None if progress is None else not progress
    chunks = checksummed = 0
    with tqdm(total=total, unit="B", unit_scale=True, desc="verifying chunks", disable=disable) as bar:
        for (part, sums), field_arrays in zip(parts, arrays, strict=True):
            # unfinished: offsets[0] and the sidecar may be ahead of the ledger, so sums cover less
            usable = sums is not None and (sums.rows, sums.tokens) == (part.rows, part.tokens)
            size = sums.chunk_elements if sums is not None else DEFAULT_CHUNK_SIZE
            for name, array, n, recorded in (
                ("offsets", field_arrays.offsets, part.rows + 1, sums.offsets if usable else None),
                ("data", field_arrays.data, part.tokens, sums.data if usable else None),
            ):
                where = posixpath.join(part.root, field, name)
                head = part.rows if name == "offsets" else None
                done = _verify_array(array, n, size, recorded, where=where, bar=bar, head=head)
                chunks += done
                checksummed += done if recorded is not None else 0
    return DeepResult(chunks, total, time.perf_counter() - start, checksummed)


def _verify_array(
    array: ts.TensorStore,
    n: int,
    size: int,
    recorded: tuple[int, ...] | None,
    *,
    where: str,
    bar,
    head: int | None = None,
) -> int:
    """Reads ``array[0:n]`` chunk by chunk, ``READS_IN_FLIGHT`` at a time; returns the chunks read.

    ``head``: the value element 0 is summed as. For offsets it is the ledger's row count, which
    ``check_row_count`` already compared with ``offsets[0]``: a writer killed after advancing
    ``offsets[0]`` and before its next commit leaves it ahead of the ledger and its checksums.
    """
    count = -(-n // size)
    pending: collections.deque = collections.deque()

    def settle() -> None:
        k, future = pending.popleft()
        lo, hi = k * size, min((k + 1) * size, n)
        try:
            values = future.result()
            if k == 0 and head is not None and values.size:
                values = values.copy()
                values[0] = head
        except ValueError as e:
            raise CacheIntegrityError(
                f"{where}: chunk {k} (elements [{lo}, {hi})) cannot be read: {e}"
            ) from e
        if recorded is not None and chunk_crc(values) != recorded[k]:
            raise CacheIntegrityError(
                f"{where}: chunk {k} (elements [{lo}, {hi})) fails its checksum: the writer recorded "
                f"crc32 {recorded[k]:#010x}, the chunk now sums to {chunk_crc(values):#010x}"
            )
        bar.update(values.nbytes)

    for k in range(count):
        pending.append((k, array[k * size : min((k + 1) * size, n)].read()))
        if len(pending) >= READS_IN_FLIGHT:
            settle()
    while pending:
        settle()
    return count
