"""``validate_cache`` and the report ``meshbatch validate-cache`` prints: valid, or the first problem.

Two depths (what each catches and costs is tabled in ``docs/cache.md``):

- default (metadata only, milliseconds): everything ``TokenCache.open`` checks (ledger types and
  counts, ``offsets[0]``, offsets monotone and ending where the ledger says, the data chunk holding
  the last token present, arrays in Levanter's layout) plus the checksum sidecar's dtype and counts;
- ``deep=True``: also reads every chunk of both arrays, checks it decodes and, for caches meshbatch
  wrote, that it matches the CRC-32 its writer recorded (``deep.py``)::

    validate_cache("/c")              -> OK, checksums "present (verify with --deep)"
    validate_cache("/c", deep=True)   -> INVALID: /c/input_ids/data: chunk 0 (elements [0, 262144))
                                         fails its checksum: the writer recorded crc32 0x1c291ca3, ...

Whatever is wrong, the report names it; nothing raises out of ``validate_cache``.
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass

from meshbatch.arguments import check_bool
from meshbatch.cache.format.checks import check_component, check_path
from meshbatch.cache.format.ledger import CONSOLIDATED, LEDGER_FILE_NAME
from meshbatch.cache.format.shard_table import shard_root, shard_table
from meshbatch.cache.integrity.deep import Part, part_sidecar, verify_parts
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
        for e in shard_table(ledger, cache.field, where=posixpath.join(cache.path, LEDGER_FILE_NAME))
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
