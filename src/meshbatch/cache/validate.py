"""Checks that make a token cache trustworthy, and the report ``meshbatch validate-cache`` prints.

``TokenCache.open`` runs every check; each failure is an error naming the file and the bad value:

    missing ledger          FileNotFoundError  no ledger at /c/shard_ledger.json ...
    unfinished ledger       ValueError         cache at /c is not finished (ledger is_finished=false ...)
    missing zarr metadata   FileNotFoundError  missing zarr metadata /c/input_ids/data/zarr.json
    offsets not monotone    ValueError         /c/input_ids/offsets not monotone: row 2 spans [9, 4)
    offsets beyond data     ValueError         /c/input_ids/offsets reach token 99, beyond the stored data ...
    dtype mismatch          ValueError         /c/input_ids/data has dtype uint16, expected int32
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import tensorstore as ts

from .arrays import stored_extent

logger = logging.getLogger(__name__)


def check_offsets(raw: np.ndarray, *, rows: int, finished: bool, where: str) -> np.ndarray:
    """Checks ``offsets[0 : rows + 1]`` as read from disk and returns them normalised to start at 0.

    Args:
        raw: int64 ``[rows + 1]``; ``raw[0]`` is the row count written on disk.
        rows: rows the ledger commits.
        finished: the ledger is finished, so the on-disk count must equal ``rows`` exactly (a writer
            may have written offsets for rows it has not committed yet otherwise).
        where: the offsets array's path, for messages.

    Returns:
        int64 ``[rows + 1]``: row ``i`` spans tokens ``[out[i], out[i + 1])``.
    """
    on_disk = int(raw[0])
    if on_disk < rows or (finished and on_disk != rows):
        raise ValueError(f"{where}: offsets[0] = {on_disk} rows on disk, but the ledger commits {rows} rows")
    offsets = np.array(raw, dtype=np.int64)
    offsets[0] = 0
    bad = np.flatnonzero(offsets[1:] < offsets[:-1])
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{where} not monotone: row {i} spans [{offsets[i]}, {offsets[i + 1]})")
    return offsets


def check_extent(end: int, *, data: ts.TensorStore, recorded: int | None, where: str) -> None:
    """Checks that offsets ending at token ``end`` stay within what the data array holds.

    Args:
        end: the last offset (tokens in the field).
        data: the data array; its stored chunks and domain bound the tokens it holds.
        recorded: the token count the ledger records, if any; must equal ``end``.
        where: the offsets array's path, for messages.
    """
    if recorded is not None and recorded != end:
        raise ValueError(f"{where} reach token {end}, but the ledger records {recorded} tokens")
    if end == 0:
        return
    if not data.domain.implicit_upper_bounds[0] and end > data.domain.exclusive_max[0]:
        raise ValueError(f"{where} reach token {end}, beyond the data array's shape {data.domain.shape[0]}")
    extent = stored_extent(data)
    if end > extent:
        raise ValueError(
            f"{where} reach token {end}, beyond the stored data (its chunks cover {extent} tokens)"
        )


def check_dtype(found: np.dtype, expected: np.dtype | None, *, where: str) -> None:
    """Raises when ``expected`` is given and differs from the on-disk ``found``."""
    if expected is not None and np.dtype(found) != np.dtype(expected):
        raise ValueError(f"{where} has dtype {np.dtype(found)}, expected {np.dtype(expected)}")


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
        return "\n".join(lines)


def validate_cache(path: str, field: str = "input_ids", *, require_finished: bool = True) -> ValidationReport:
    """Opens the cache at ``path`` with every check and reports the result instead of raising."""
    from .reader import TokenCache  # the reader runs the checks above; imported here to avoid a cycle

    try:
        cache = TokenCache.open(path, field, require_finished=require_finished)
    except (FileNotFoundError, ValueError) as e:
        logger.info("cache %s failed validation: %s", path, e)
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
    )
