"""``validate_cache`` and the report ``meshbatch validate-cache`` prints: valid, or the first problem.

Two depths (what each catches and costs is tabled in ``docs/cache.md``):

- default (metadata only, milliseconds): everything ``TokenCache.open`` checks (ledger types and
  counts, ``offsets[0]``, offsets monotone and ending where the ledger says, the data chunk holding
  the last token present, arrays in Levanter's layout) plus the checksum sidecar's dtype and counts;
- ``deep=True``: also reads every chunk of both arrays, checks it decodes and, for caches meshbatch
  wrote, that it matches the CRC-32 its writer recorded (``verify_parts``)::

    validate_cache("/c")              -> OK, checksums "present (verify with --deep)"
    validate_cache("/c", deep=True)   -> INVALID: /c/input_ids/data: chunk 0 (elements [0, 262144))
                                         fails its checksum: the writer recorded crc32 0x1c291ca3, ...

Whatever is wrong, the report names it; nothing raises out of ``validate_cache``.

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
import logging
import posixpath
import time
from dataclasses import dataclass

import numpy as np
import tensorstore as ts
from tqdm.auto import tqdm

from meshbatch.arguments import check_bool
from meshbatch.cache.format.arrays import DEFAULT_CHUNK_SIZE, open_field
from meshbatch.cache.format.checks import CacheIntegrityError, check_component, check_path
from meshbatch.cache.format.ledger import CONSOLIDATED, shard_root, shard_table
from meshbatch.cache.integrity.checksums import Checksums, check_sidecar, checksum_mismatch
from meshbatch.cache.read.reader import TokenCache

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ValidationReport:
    """The outcome of ``validate_cache``: either a summary of a good cache or the first problem."""

    path: str
    ok: bool
    error: str | None = None
    layout: str | None = None
    is_finished: bool | None = None
    num_rows: int | None = None
    num_tokens: int | None = None
    dtype: str | None = None
    num_shards: int | None = None
    deep: bool = False
    checksums: str | None = None
    chunks_read: int | None = None
    bytes_read: int | None = None
    seconds: float | None = None

    def format(self) -> str:
        """Human-readable lines for the CLI."""
        if not self.ok:
            return f"INVALID {self.path}\n  {self.error}"
        lines = [
            f"OK {self.path}",
            f"  layout      {self.layout} ({self.num_shards} shard{'s' if self.num_shards != 1 else ''})",
            f"  finished    {self.is_finished}",
            f"  rows        {self.num_rows}",
            f"  tokens      {self.num_tokens}",
            f"  dtype       {self.dtype}",
        ]
        if self.deep:
            rate = self.bytes_read / max(self.seconds, 1e-9) / 1e6
            lines.append(
                f"  checked     every chunk decoded: {self.chunks_read} chunks, "
                f"{self.bytes_read / 1e6:.1f} MB in {self.seconds:.2f} s ({rate:.0f} MB/s)"
            )
        else:
            lines.append("  checked     metadata only (--deep reads every chunk)")
        lines.append(f"  checksums   {self.checksums}")
        return "\n".join(lines)


def validate_cache(
    path: str,
    field: str = "input_ids",
    *,
    require_finished: bool = True,
    deep: bool = False,
    progress: bool | None = None,
) -> ValidationReport:
    """Checks the cache at ``path`` and reports the result instead of raising.

    Args:
        path: cache root (local path or TensorStore URL).
        field: the jagged field to check: one path component (``check_component``).
        require_finished: an unfinished cache is invalid; pass False to check its committed rows.
        deep: also read every chunk (see the module docstring).
        progress: with ``deep``, show a progress bar; ``None`` shows it only on a terminal.

    Raises:
        TypeError, ValueError: a bad argument (the cache itself never raises; it is reported).
    """
    path, field = check_path("path", path), check_component("field", field)
    check_bool("require_finished", require_finished)
    check_bool("deep", deep)
    try:
        cache = TokenCache.open(path, field, require_finished=require_finished, verify=True, eager=True)
        parts = [(part, part_sidecar(part, field, cache.dtype)) for part in _parts(cache)]
        result = verify_parts(parts, field, progress=progress) if deep else None
    except Exception as e:  # a validator reports every failure, expected or not, instead of raising
        logger.info("cache %s failed validation", path, exc_info=True)
        return ValidationReport(path, ok=False, error=f"{type(e).__name__}: {e}")
    return ValidationReport(
        path,
        ok=True,
        layout=cache.layout,
        is_finished=cache.is_finished,
        num_rows=cache.num_rows,
        num_tokens=cache.num_tokens,
        dtype=str(cache.dtype),
        num_shards=cache.num_shards,
        deep=deep,
        checksums=_checksums_line([sums for _, sums in parts], result),
        chunks_read=result.chunks if result else None,
        bytes_read=result.nbytes if result else None,
        seconds=result.seconds if result else None,
    )


def _parts(cache: TokenCache) -> list[Part]:
    ledger = cache.ledger
    if ledger.layout == CONSOLIDATED:
        return [Part(cache.path, cache.num_rows, cache.num_tokens, ledger.is_finished)]
    return [
        Part(shard_root(cache.path, e.name), e.rows, e.tokens, True)
        for e in shard_table(ledger, cache.field, root=cache.path)
    ]


def _checksums_line(sidecars, result) -> str:
    present = sum(s is not None for s in sidecars)
    if present == 0:
        return "absent (no meshbatch checksum sidecar, e.g. written by Levanter)"
    which = "present" if present == len(sidecars) else f"present for {present} of {len(sidecars)} shards"
    if result is None:
        return f"{which} (verify with --deep)"
    if result.checksummed_chunks == 0:
        return f"{which}, not verified: the writer is between commits"
    return f"{which}, {result.checksummed_chunks} chunks verified"


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
    """Reads every chunk of every part (each with its checked sidecar, or None): see the module
    docstring; ``progress`` as ``validate_cache``'s."""
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
        except ValueError as e:
            raise CacheIntegrityError(
                f"{where}: chunk {k} (elements [{lo}, {hi})) cannot be read: {e}"
            ) from e
        wrong = checksum_mismatch(values, recorded, k, lo=lo, where=where, head=head if k == 0 else None)
        if wrong is not None:
            raise CacheIntegrityError(wrong)
        bar.update(values.nbytes)

    for k in range(count):
        pending.append((k, array[k * size : min((k + 1) * size, n)].read()))
        if len(pending) >= READS_IN_FLIGHT:
            settle()
    while pending:
        settle()
    return count
