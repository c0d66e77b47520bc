"""Host diagnostics of a splice schedule: rows per document, token coverage, the validation grid.

They read a schedule; none is part of making a batch.

    schedule over one doc of L = 5, seq_len = 5, content_length = 3, slide_within
    pairs_per_doc(schedule)       -> [13]
    coverage_counts(schedule, 0)  -> [3, 6, 9, 7, 4]   (token 2 is copied by 9 of the 13 rows)
    validation_rows(schedule, starts=2, offsets=2) -> t = [0, 0, 3, 3], s = [0, 2, 0, 3]
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np

from meshbatch.arguments import check_int
from meshbatch.kernels import lookup_rows
from meshbatch.kernels.internal import BalancedPlacement, SpliceSchedule, pair_count

from .tables import spread

_canonical = jax.jit(partial(lookup_rows, shuffled=False))


def pairs_per_doc(schedule: SpliceSchedule) -> np.ndarray:
    """Rows each document owns per epoch (int64 ``[num_docs]``)."""
    return np.diff(np.asarray(schedule.cum_rows).astype(np.int64))


def coverage_counts(
    schedule: SpliceSchedule, doc: int, *, epoch: int = 0, chunk: int = 1 << 16
) -> np.ndarray:
    """How often each token of document ``doc`` is copied into a frame in one epoch.

    O(rows of ``doc``): walks the document's rows in canonical order (the multiset of a
    document's placements does not depend on the row shuffle), ``chunk`` rows a call or the
    document's rows rounded up to a power of two, whichever is less: documents of similar row
    counts share one compiled lookup (each compile of it takes seconds on a CPU backend). The
    padding lanes repeat the document's last row and are dropped.

    Returns:
        int64 ``[doc_length]`` copy counts (a cyclic copy wraps to the document start).

    Raises:
        TypeError, ValueError: a ``doc`` out of range or a bad ``epoch``/``chunk``.
    """
    num_docs = schedule.num_docs
    doc = check_int("doc", doc)
    epoch = check_int("epoch", epoch, low=0, high=2**32 - 1)
    chunk = check_int("chunk", chunk, low=1)
    if not 0 <= doc < num_docs:
        raise ValueError(f"doc={doc} is out of range for num_docs={num_docs}")
    cum = np.asarray(schedule.cum_rows).astype(np.int64)
    length = int(np.asarray(schedule.placement.doc_len)[doc])
    first, end = int(cum[doc]), int(cum[doc + 1])
    size = min(chunk, 1 << max(0, (end - first - 1).bit_length()))
    diff = np.zeros(2 * length + 1, dtype=np.int64)
    for start in range(first, end, size):
        rows = np.minimum(np.arange(start, start + size, dtype=np.int64), end - 1).astype(np.uint32)
        looked_up = _canonical(schedule, rows, np.uint32(epoch))
        _, t, _, copy_len = (np.asarray(x)[: end - start] for x in looked_up)
        np.add.at(diff, t, 1)
        np.add.at(diff, t + copy_len, -1)
    counts = np.cumsum(diff)[: 2 * length]
    return counts[:length] + counts[length:]


def placement_grid(placement, doc: int, *, starts: int, offsets: int) -> list[tuple[int, int, int]]:
    """``(t, s, copy_len)`` at ``starts`` spread starts x ``offsets`` spread placements of ``doc``."""
    length = int(np.asarray(placement.doc_len)[doc])
    if isinstance(placement, BalancedPlacement):
        content = int(np.asarray(placement.content)[doc])
        num_starts = (length - content) // placement.t_stride + 1
        jitter = int(np.asarray(placement.jitter)[doc])
        return [
            (k * placement.t_stride, placement.seq_len - content - j, content)
            for k in spread(num_starts, starts)
            for j in spread(jitter, offsets)
        ]
    rows = []
    for k in spread(int(np.asarray(placement.slots)[doc]), starts):
        v = length - k * placement.t_stride
        if placement.layout == "uniform":
            count, copy = int(np.asarray(placement.per_slot)[doc]), int(np.asarray(placement.copy)[doc])
        else:
            count = int(
                pair_count(
                    v,
                    seq_len=placement.seq_len,
                    content_length=placement.content_length,
                    offset_stride=placement.s_stride,
                )
            )
            copy = min(v, placement.content_length, placement.seq_len)
        rows += [(k * placement.t_stride, i * placement.s_stride, copy) for i in spread(count, offsets)]
    return rows


def validation_rows(schedule: SpliceSchedule, *, starts: int = 3, offsets: int = 3) -> tuple[np.ndarray, ...]:
    """The seed's validation grid: ``(doc, t, s, copy_len)`` int32 arrays, fixed and small.

    Every document with pairs contributes ``starts`` evenly spaced starts (first and last
    included) at ``offsets`` evenly spaced placements each; keys and epochs play no part.
    """
    starts = check_int("starts", starts, low=1)
    offsets = check_int("offsets", offsets, low=1)
    items = np.asarray(schedule.items)
    rows = [
        (doc, *row)
        for doc in np.flatnonzero(items > 0).tolist()
        for row in placement_grid(schedule.placement, doc, starts=starts, offsets=offsets)
    ]
    return tuple(np.asarray(column, dtype=np.int32) for column in zip(*rows, strict=True))
