"""A bounded, host-local LRU of decoded token blocks.

The token space of each data array is cut into aligned blocks of ``block_tokens`` tokens (default:
one zarr read chunk, 256Ki tokens). With a block cache, a ``TokenCache`` reads whole blocks, keeps
the most recently used ones up to ``max_bytes``, and serves later spans in those blocks from memory.
That pays off when consecutive requests revisit blocks (block shuffle with small batches); for
scattered single-use spans it only adds read amplification, so it is opt-in::

    block_tokens = 4, spans (1, 2) then (5, 2)
    request 1 -> block 0 = tokens [0, 4): miss, read, keep
    request 2 -> block 1 = tokens [4, 8): miss, read, keep   (block 0 still cached: hits later)

Nothing is shared between processes; hit/miss/eviction counts are on ``stats()``. Threads share a
block being read: the first to miss it reads it (``claim`` makes it the owner), the others wait for
that read instead of reading the same block again (``shared`` counts them)::

    thread 1: claim(b) -> owner, reads b, fulfil(b)      thread 2: claim(b) -> waits, gets b
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from meshbatch.arguments import check_int
from meshbatch.cache.format.arrays import DEFAULT_CHUNK_SIZE


class BlockCache:
    """Least-recently-used decoded blocks, bounded in bytes.

    Args:
        max_bytes: most bytes of block data held; the least recently used blocks are evicted beyond it.
        block_tokens: tokens per block; aligning it to the zarr read chunk makes each block one
            chunk decode.
    """

    def __init__(self, max_bytes: int, *, block_tokens: int = DEFAULT_CHUNK_SIZE):
        self.max_bytes = check_int("max_bytes", max_bytes, low=1)
        self.block_tokens = check_int("block_tokens", block_tokens, low=1)
        self._blocks: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._pending: dict[Hashable, Pending] = {}
        self.shared = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: Hashable) -> np.ndarray | None:
        """The cached block for ``key`` (marking it most recently used), or None; counts a hit or miss."""
        with self._lock:
            block = self._blocks.get(key)
            if block is None:
                self.misses += 1
                return None
            self._blocks.move_to_end(key)
            self.hits += 1
            return block

    def claim(self, key: Hashable) -> tuple[np.ndarray | None, Pending | None, bool]:
        """``(block, None, False)`` on a hit; else ``(None, pending, owner)``: the owner (the first
        to miss) must ``fulfil`` or ``abandon`` the key; the others wait on ``pending``."""
        return self.claim_each([key])[0]

    def claim_each(self, keys) -> list[tuple[np.ndarray | None, Pending | None, bool]]:
        """``claim`` of each of ``keys`` (distinct), under one lock."""
        got = []
        with self._lock:
            blocks, pendings = self._blocks, self._pending
            for key in keys:
                block = blocks.get(key)
                if block is not None:
                    blocks.move_to_end(key)
                    self.hits += 1
                    got.append((block, None, False))
                    continue
                pending = pendings.get(key)
                if pending is not None:
                    self.shared += 1
                    got.append((None, pending, False))
                    continue
                self.misses += 1
                pending = pendings[key] = Pending()
                got.append((None, pending, True))
        return got

    def fulfil(self, key: Hashable, block: np.ndarray) -> None:
        """The owner of ``key`` read ``block``: cache it and hand it to the waiting threads."""
        self.put(key, block)
        with self._lock:
            pending = self._pending.pop(key, None)
        if pending is not None:
            pending.block = block
            pending.done.set()

    def abandon(self, key: Hashable, error: BaseException) -> None:
        """The owner of ``key`` failed to read it: the waiting threads get ``error``."""
        with self._lock:
            pending = self._pending.pop(key, None)
        if pending is not None:
            pending.error = error
            pending.done.set()

    def put(self, key: Hashable, block: np.ndarray) -> None:
        """Inserts ``block`` (an owned array) and evicts least recently used blocks beyond ``max_bytes``.

        A block larger than ``max_bytes`` is not kept.
        """
        if block.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._blocks[key] = block
            self._bytes += block.nbytes
            while self._bytes > self.max_bytes:
                _, evicted = self._blocks.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.evictions += 1

    def clear(self) -> None:
        """Drops every block (counts are kept)."""
        with self._lock:
            self._blocks.clear()
            self._bytes = 0

    def stats(self) -> dict[str, int]:
        """Hits, misses, evictions, reads shared with another thread, blocks held and bytes held."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "shared": self.shared,
                "blocks": len(self._blocks),
                "bytes": self._bytes,
            }


class Pending:
    """A block one thread is reading for others: set ``done`` with ``block`` or ``error``."""

    def __init__(self):
        self.done = threading.Event()
        self.block: np.ndarray | None = None
        self.error: BaseException | None = None
