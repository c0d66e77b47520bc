"""Resuming a cache a writer was killed writing: its stale tail zeroed, its checksums picked up.

A killed flush may have written offsets and tokens past the committed end (and advanced
``offsets[0]``); ``zero_past`` zeroes them so the resumed cache holds exactly what a clean build of
its committed rows holds, and ``resume_checksums`` rebuilds the running checksum trackers from the
sidecar (full chunks) and the disk (the partial ones).
"""

from __future__ import annotations

import logging

import numpy as np

from .arrays import DEFAULT_CHUNK_SIZE, FieldArrays
from .checks import CacheIntegrityError
from .checksums import OffsetsChecksums, RunningChecksums, chunk_crc, read_checksums

logger = logging.getLogger(__name__)


def zero_past(array, start: int) -> int:
    """Zeroes ``array[start:]`` wherever it is stored; returns how many non-zero values it found.

    Only a killed flush writes past the committed end, and it writes one contiguous range, so the
    stored chunks past ``start`` are the one holding ``start`` and those right after it: they are
    read, and rewritten as zeros only when some value is not zero. A resumed cache then holds
    exactly what a clean build of its committed rows holds.

        start = 6, chunk 4, stored [1 2 3 4 | 5 6 9 9 | 9 9 . .]  ->  [1 2 3 4 | 5 6 0 0 | 0 0 . .]
    """
    size = DEFAULT_CHUNK_SIZE
    first = start // size
    last = first if start % size or _stored(array, first) else first - 1
    while last >= first and _stored(array, last + 1):
        last += 1
    if last < first:
        return 0
    region = array[start : (last + 1) * size]
    found = int(np.count_nonzero(region.read().result()))
    if found:
        region.write(np.zeros(region.shape, region.dtype.numpy_dtype)).result()
    return found


def _stored(array, chunk: int) -> bool:
    """Whether inner chunk ``chunk`` is stored (the array reads missing chunks as errors)."""
    size = DEFAULT_CHUNK_SIZE
    try:
        array[chunk * size : chunk * size + 1].read().result()
    except ValueError as e:
        if "NOT_FOUND" in str(e):
            return False
        raise
    return True


def resume_checksums(
    arrays: FieldArrays, field_root: str, *, rows: int, tokens: int, dtype: np.dtype
) -> tuple[RunningChecksums, OffsetsChecksums]:
    """The checksum trackers at the committed ``rows``/``tokens``.

    Full chunks below the commit keep the sidecar's sums (it is written before each ledger, so it
    covers at least the committed rows); partial chunks, and every chunk when the sidecar is missing
    or does not match, are summed from disk.
    """
    size = DEFAULT_CHUNK_SIZE
    try:
        found = read_checksums(field_root)
    except CacheIntegrityError as e:
        logger.warning("ignoring a damaged checksum sidecar; re-summing from disk: %s", e)
        found = None
    usable = found is not None and found.chunk_elements == size and found.dtype == dtype
    full_data, full_offsets = tokens // size, (rows + 1) // size

    def sums(array, stop: int, recorded: tuple[int, ...] | None, first: int = 0) -> list[int]:
        if recorded is not None and len(recorded) >= stop:
            return list(recorded[first:stop])
        logger.info("summing chunks %d..%d of %s from disk", first, stop, field_root)
        return [chunk_crc(array[k * size : (k + 1) * size].read().result()) for k in range(first, stop)]

    data_done = sums(arrays.data, full_data, found.data if usable else None)
    data_tail = arrays.data[full_data * size : tokens].read().result()
    head = arrays.offsets[1 : min(size, rows + 1)].read().result()
    rest_done = sums(arrays.offsets, full_offsets, found.offsets if usable else None, first=1)
    tail_start = max(size, full_offsets * size)
    rest_tail = arrays.offsets[tail_start : rows + 1].read().result() if rows + 1 > tail_start else []
    offsets = OffsetsChecksums(size, head, RunningChecksums(size, np.int64, rest_done, rest_tail))
    return RunningChecksums(size, dtype, data_done, data_tail), offsets
