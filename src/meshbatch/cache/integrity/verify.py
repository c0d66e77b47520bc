"""Verified reads: what a reader serves is checked against the CRC-32s its writer recorded.

A cache meshbatch wrote has a checksum sidecar (``checksums.py``): a CRC-32 per
``chunk_elements``-element chunk of both arrays. A reader uses it twice:

- at open (and ``refresh``), the offsets it loads are summed chunk by chunk in memory (they are
  read anyway) and the data chunk holding the last token is read whole and summed;
- on the first read that touches a data chunk, the whole chunk is read in the same TensorStore
  batch, summed and compared; a chunk that matches is remembered (per reader), so later reads of
  it cost nothing::

    sidecar: chunk_elements 4, tokens 10, data [c0, c1, c2]
    read tokens [5, 7)   -> chunk 1 = tokens [4, 8) read too; crc32 == c1? remember (1, 4)
    read tokens [6, 10)  -> chunk 1 remembered; chunk 2 = tokens [8, 10) read and summed

Through a ``BlockCache`` (``reads.py``), the thread that reads a block also verifies every chunk
the block covers whole, from what it read, before other threads get the block; a thread waiting
for the block reads none of those chunks again (it checks them from the block only where its own
reader has not verified them: a block read by a reader with verification off)::

    blocks of 2 chunks: A reads block 0 for tokens in chunk 0, B waits for it for chunk 1
    A -> 1 read, checks chunks 0 and 1, publishes;  B -> no read, chunk 1 already verified

A mismatch is a ``CacheIntegrityError`` naming the cache, the array, the chunk and its token range
(bit rot that still decodes, a chunk copied over from another cache, an offset moved). A chunk
whose recorded extent reaches past the rows the reader's ledger commits (a cache still being
written) is verified once the reader loads a ledger that covers it. Caches without a sidecar
(Levanter's) have nothing to verify against. ``MESHBATCH_VERIFY_READS=0`` (or
``TokenCache.open(..., verify=False)``) turns verification off.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from meshbatch.cache.format.checks import CacheIntegrityError
from meshbatch.cache.integrity.checksums import Checksums, checksum_mismatch

VERIFY_ENV = "MESHBATCH_VERIFY_READS"


def verify_default() -> bool:
    """Whether reads are verified when ``verify`` is not given: ``MESHBATCH_VERIFY_READS`` (default on)."""
    return os.environ.get(VERIFY_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class ChunkVerifier:
    """The data chunks of one consolidated part a reader may verify (``sums``: its checked sidecar;
    ``tokens``: what the reader's ledger commits of it), and those it has verified (from
    ``verified``: the ``(chunk, length)`` pairs an earlier snapshot of the same part verified)."""

    def __init__(self, sums: Checksums, tokens: int, *, where: str, verified: frozenset = frozenset()):
        self.size, self.extent, self.recorded, self.where = sums.chunk_elements, sums.tokens, sums.data, where
        # a chunk is final once every element it sums is committed; the tail only when the counts agree
        self.limit = len(sums.data) if sums.tokens == tokens else tokens // self.size
        self._verified = {(k, n) for k, n in verified if k < self.limit and n == self._length(k)}
        self._lock = threading.Lock()

    def _length(self, k: int) -> int:
        return min((k + 1) * self.size, self.extent) - k * self.size

    def bounds(self, k: int) -> tuple[int, int]:
        """Element range ``[lo, hi)`` of data chunk ``k`` that its checksum covers."""
        return k * self.size, k * self.size + self._length(k)

    @property
    def complete(self) -> bool:
        """Every chunk that can be verified is: reads need no check at all (the steady state)."""
        return len(self._verified) >= self.limit

    def pending(self, lo: int, hi: int) -> list[int]:
        """Chunks overlapping tokens ``[lo, hi)`` that can be verified and are not yet."""
        if self.complete:
            return []
        last = min((hi - 1) // self.size, self.limit - 1)
        with self._lock:
            return [k for k in range(lo // self.size, last + 1) if (k, self._length(k)) not in self._verified]

    def within(self, lo: int, hi: int) -> list[int]:
        """Chunks lying whole in tokens ``[lo, hi)`` that can be verified (verified or not)."""
        last = min(hi // self.size + 1, self.limit)  # + 1: a short last chunk may end before hi
        return [k for k in range(-(-lo // self.size), last) if self.bounds(k)[1] <= hi]

    def pending_within(self, lo: int, hi: int) -> list[int]:
        """Chunks lying whole in tokens ``[lo, hi)`` that can be verified and are not yet."""
        if self.complete:
            return []
        with self._lock:
            return [k for k in self.within(lo, hi) if (k, self._length(k)) not in self._verified]

    def check_within(self, start: int, values: np.ndarray, *, cache: str, token_start: int) -> None:
        """Verifies, from ``values`` (tokens ``[start, start + len(values))``, on-disk dtype), every
        chunk lying whole in them that is not verified yet (a block read by another reader)."""
        for k in self.pending_within(start, start + values.shape[0]):
            lo, hi = self.bounds(k)
            self.check(k, values[lo - start : hi - start], cache=cache, token_start=token_start)

    def check(self, k: int, values: np.ndarray, *, cache: str, token_start: int | None) -> None:
        """Compares chunk ``k``'s values with its recorded CRC-32; remembers a match.

        Raises:
            CacheIntegrityError: they differ (names the cache, the array, the chunk and its tokens).
        """
        lo, hi = self.bounds(k)
        wrong = checksum_mismatch(values, self.recorded, k, lo=lo, where=self.where)
        if wrong is not None:
            tokens = (
                "" if token_start is None else f" (global tokens [{token_start + lo}, {token_start + hi}))"
            )
            raise CacheIntegrityError(f"cache {cache}: {wrong}{tokens}")
        with self._lock:
            self._verified.add((k, values.shape[0]))

    def verified(self) -> frozenset:
        """The ``(chunk, length)`` pairs verified so far."""
        with self._lock:
            return frozenset(self._verified)


def verify_offsets(raw: np.ndarray, sums: Checksums, *, first: int, where: str) -> None:
    """Checks the chunks of ``raw`` (int64 ``[rows + 1]`` offsets as on disk) that hold elements
    ``first`` (the first loaded now) and after against ``sums``, the part's checked sidecar (it may
    record more rows than ``raw`` holds); a mismatch is a ``CacheIntegrityError``.

    Chunk 0 is checked whenever it is complete, since ``offsets[0]`` changes with every commit. It
    is summed with ``sums.rows`` as element 0, the count its writer summed: ``offsets[0]`` is ahead
    of the sidecar while a writer is between steps 2 and 3 of a commit (or was killed there), and
    the rest of chunk 0 must still be what it recorded::

        sidecar rows 2, offsets[0:3] on disk [3, 7, 20]  ->  crc32 of [2, 7, 20] vs the recorded one
    """
    size, n = sums.chunk_elements, raw.shape[0]
    for k in sorted({0, *range(first // size, -(-n // size))}):
        lo, hi = k * size, min((k + 1) * size, sums.rows + 1)
        if hi > n or hi <= lo:
            continue  # elements past the rows loaded (the sidecar is ahead): not final
        verify_offsets_chunk(raw[lo:hi], k, sums, where=where)


def verify_offsets_chunk(values: np.ndarray, k: int, sums: Checksums, *, where: str) -> None:
    """Checks offsets chunk ``k`` (``values``: its elements as on disk, the whole chunk the sidecar
    sums) against the sidecar, chunk 0 summed with ``sums.rows`` as element 0: ``verify_offsets``
    checks loaded offsets this way, and a cache opened without loading them a chunk at a time,
    where they are read."""
    head = sums.rows if k == 0 else None
    wrong = checksum_mismatch(values, sums.offsets, k, lo=k * sums.chunk_elements, where=where, head=head)
    if wrong is not None:
        raise CacheIntegrityError(wrong)


def check_last_chunk(verifier: ChunkVerifier, data, end: int, *, cache: str) -> None:
    """Reads the whole data chunk holding token ``end - 1`` and verifies it (at open: a chunk
    copied over from a smaller cache reads its zeros past that cache's end)."""
    if end == 0:
        return
    k = (end - 1) // verifier.size
    if k >= verifier.limit or not verifier.pending(end - 1, end):
        return  # not final yet, or verified by an earlier snapshot
    lo, hi = verifier.bounds(k)
    try:
        values = data[lo:hi].read().result()
    except ValueError as e:
        raise CacheIntegrityError(f"cache {cache}: {verifier.where}: chunk {k} cannot be read: {e}") from e
    verifier.check(k, values, cache=cache, token_start=None)
