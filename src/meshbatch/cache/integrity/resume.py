"""Resuming a cache a writer was killed writing: damage refused, stale tail zeroed, checksums picked up.

A killed flush may have written offsets and tokens past the committed end (and advanced
``offsets[0]``); ``zero_past`` zeroes them so the resumed cache holds exactly what a clean build of
its committed rows holds. ``resume_checksums`` rebuilds the running checksum trackers: full chunks
keep the sidecar's sums, and the chunks it must sum again from disk (the partial last data chunk,
offsets chunk 0, the partial last offsets chunk) are first compared with the CRC-32s the sidecar
records, so damage done before the resume is refused by name, never given a fresh checksum::

    sidecar tokens 20, data [c0]; ledger commits 20 tokens; data[3] rotted on disk
    resume -> crc32(data[0:20]) != c0 -> CacheIntegrityError "cannot resume /c: /c/input_ids/data:
              chunk 0 (elements [0, 20)) fails its checksum ..."

A sidecar ahead of the ledger (a writer killed between the two renames) records chunks that reach
past the commit; on disk they still hold what it recorded (nothing writes past a commit before the
next resume), so they are read to the sidecar's extent, checked, then cut at the commit.
"""

from __future__ import annotations

import logging
import posixpath

import numpy as np

from meshbatch.cache.format.arrays import DEFAULT_CHUNK_SIZE, FieldArrays
from meshbatch.cache.format.checks import CacheIntegrityError
from meshbatch.cache.integrity.checksums import (
    Checksums,
    OffsetsChecksums,
    RunningChecksums,
    check_sidecar,
    checksum_mismatch,
    chunk_crc,
    sidecar_path,
)

logger = logging.getLogger(__name__)


def zero_past(array, start: int, *, where: str, path: str) -> int:
    """Zeroes ``array[start:]`` wherever it is stored; returns how many non-zero values it found.

    Only a killed flush writes past the committed end, and it writes one contiguous range, so the
    stored chunks past ``start`` are the one holding ``start`` and those right after it: they are
    read, and rewritten as zeros only when some value is not zero. A resumed cache then holds
    exactly what a clean build of its committed rows holds.

        start = 6, chunk 4, stored [1 2 3 4 | 5 6 9 9 | 9 9 . .]  ->  [1 2 3 4 | 5 6 0 0 | 0 0 . .]

    ``where`` (the array's path) and ``path`` (the cache's) name a read that fails
    (``CacheIntegrityError``).
    """
    size = DEFAULT_CHUNK_SIZE
    first = start // size
    last = first if start % size or _stored(array, first, where=where, path=path) else first - 1
    while last >= first and _stored(array, last + 1, where=where, path=path):
        last += 1
    if last < first:
        return 0
    end = (last + 1) * size
    found = int(np.count_nonzero(read_range(array, start, end, where=where, path=path)))
    if found:
        region = array[start:end]
        region.write(np.zeros(region.shape, region.dtype.numpy_dtype)).result()
    return found


def _stored(array, chunk: int, *, where: str, path: str) -> bool:
    """Whether inner chunk ``chunk`` is stored (the array reads missing chunks as errors)."""
    size = DEFAULT_CHUNK_SIZE
    try:
        array[chunk * size : chunk * size + 1].read().result()
    except ValueError as e:
        if "NOT_FOUND" in str(e):
            return False
        raise CacheIntegrityError(f"cannot resume {path}: {where} chunk {chunk} cannot be read: {e}") from e
    return True


def read_range(array, lo: int, hi: int, *, where: str, path: str) -> np.ndarray:
    """``array[lo:hi]``; a read TensorStore fails (a deleted shard, a chunk that does not decode) is a
    ``CacheIntegrityError`` naming the cache that cannot be resumed, the array and the elements."""
    try:
        return array[lo:hi].read().result()
    except ValueError as e:
        raise CacheIntegrityError(
            f"cannot resume {path}: {where} elements [{lo}, {hi}) cannot be read: {e}"
        ) from e


def committed_sidecar(
    field_root: str, *, path: str, rows: int, tokens: int, dtype: np.dtype, cache_id: str | None
) -> Checksums | None:
    """The sidecar a resume checks against, or None for a cache without one (Levanter's).

    Raises:
        CacheIntegrityError: the sidecar is malformed, has another chunk size or dtype, records fewer
            rows or tokens than the ledger commits, or is missing though the ledger has a ``cache_id``
            (meshbatch's writer writes the sidecar before every ledger). Pass ``if_exists="overwrite"``
            to rebuild such a cache.
    """
    where = sidecar_path(field_root)
    try:
        found = check_sidecar(field_root, rows=rows, tokens=tokens, finished=False, dtype=dtype)
        if found is None and cache_id is not None:
            raise CacheIntegrityError(
                f"{where} is missing, but the ledger has cache_id {cache_id!r}: meshbatch's writer wrote "
                "it before every ledger"
            )
        if found is not None and found.chunk_elements != DEFAULT_CHUNK_SIZE:
            raise CacheIntegrityError(
                f"{where} has chunk_elements={found.chunk_elements}; meshbatch's writer writes "
                f"{DEFAULT_CHUNK_SIZE}"
            )
    except CacheIntegrityError as e:
        raise CacheIntegrityError(f"cannot resume {path}: {e} (rebuild it with if_exists='overwrite')") from e
    return found


def resume_checksums(
    arrays: FieldArrays, sums: Checksums | None, *, path: str, rows: int, tokens: int, dtype: np.dtype
) -> tuple[RunningChecksums, OffsetsChecksums]:
    """The checksum trackers at the committed ``rows``/``tokens``, before anything is written.

    Full chunks below the commit keep the sidecar's sums (not read). The last data chunk (partial or
    not), offsets chunk 0 (summed with ``sums.rows`` as element 0, what its writer summed) and the
    partial last offsets chunk are read to the sidecar's extent and must match it. Without a sidecar
    (``sums`` None: a Levanter cache) every chunk is summed from disk.

    Raises:
        CacheIntegrityError: a chunk differs from its recorded CRC-32, or cannot be read (named).
    """
    size = DEFAULT_CHUNK_SIZE
    data_where, offsets_where = posixpath.join(arrays.root, "data"), posixpath.join(arrays.root, "offsets")

    def chunks(array, k: int, stop: int, end: int, recorded, *, where: str, head: int | None = None):
        """Chunk ``k`` read up to ``end`` elements in (its recorded extent), checked; cut at ``stop``."""
        lo = k * size
        values = read_range(array, lo, end, where=where, path=path)
        wrong = checksum_mismatch(values, recorded, k, lo=lo, where=where, head=head)
        if wrong is not None:
            raise CacheIntegrityError(
                f"cannot resume {path}: {wrong} (rebuild it with if_exists='overwrite')"
            )
        return values[: stop - lo]

    def done(array, first: int, stop: int, recorded, *, where: str) -> list[int]:
        if recorded is not None:
            return list(recorded[first:stop])
        logger.info("summing chunks %d..%d of %s from disk", first, stop, where)
        return [
            chunk_crc(read_range(array, k * size, (k + 1) * size, where=where, path=path))
            for k in range(first, stop)
        ]

    data_sums, offsets_sums = (sums.data, sums.offsets) if sums is not None else (None, None)
    extent_data = sums.tokens if sums is not None else tokens
    extent_offsets = sums.rows + 1 if sums is not None else rows + 1

    full_data = tokens // size
    data_tail = np.zeros(0, dtype)
    if tokens % size:
        end = min((full_data + 1) * size, extent_data)
        data_tail = chunks(arrays.data, full_data, tokens, end, data_sums, where=data_where)
    elif tokens:  # the last chunk is full: checked all the same (a deleted shard is named here)
        chunks(arrays.data, full_data - 1, tokens, tokens, data_sums, where=data_where)
    data_done = done(arrays.data, 0, full_data, data_sums, where=data_where)

    head_rows = sums.rows if sums is not None else rows
    head = chunks(
        arrays.offsets,
        0,
        min(size, rows + 1),
        min(size, extent_offsets),
        offsets_sums,
        where=offsets_where,
        head=head_rows,
    )[1:]
    full_offsets = (rows + 1) // size
    rest_done = done(arrays.offsets, 1, full_offsets, offsets_sums, where=offsets_where)
    rest_tail = np.zeros(0, np.int64)
    if full_offsets >= 1 and (rows + 1) % size:
        end = min((full_offsets + 1) * size, extent_offsets)
        rest_tail = chunks(arrays.offsets, full_offsets, rows + 1, end, offsets_sums, where=offsets_where)
    offsets = OffsetsChecksums(size, head, RunningChecksums(size, np.int64, rest_done, rest_tail))
    return RunningChecksums(size, dtype, data_done, data_tail), offsets
