"""``mixture_schedule``: a stable mixture of named sources as a device row map.

    schedule = meshbatch.mixture_schedule({"web": 1000, "code": 300}, {"web": 0.7, "code": 0.3},
                                          block_size=10, key=0)
    source, index = schedule.lookup(jnp.arange(20, dtype=jnp.uint32))
    # every block of 10 rows: 7 rows of web, 3 of code, in a keyed order per block

Stop strategies (what happens when a source runs out):

- ``"restart"`` (Levanter's): a source that runs out starts over (``index = reads mod length``,
  the source's epoch counts the wraps); the mixture never ends.
- ``"first_exhausted"``: the mixture ends just before the first row that would read past the end
  of any source: its length is the smallest row whose read has number ``length[s]``, over all
  sources. Rows before it never wrap. Rows after it in the same block are dropped.
- ``"all_exhausted"``: the mixture ends just after the row that reads the last item of the source
  that finishes last; sources that finish earlier restart (wrap) meanwhile, so every item of every
  source is read at least once. A source with no rows in the last stage would never finish: an
  error.

A finite mixture repeated over epochs replays the same ``(source, index)`` rows; each source's
epoch moves on by its wraps per pass, so a source that reshuffles per epoch reads a new order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from meshbatch.checks import as_key, check_choice, check_int
from meshbatch.kernels import MixtureSchedule, mixture_block_ids

from .weights import Weights, block_counts, check_lengths, check_stages

StopStrategy = Literal["restart", "first_exhausted", "all_exhausted"]
STRATEGIES = ("restart", "first_exhausted", "all_exhausted")
MAX_BLOCK_SIZE = {"levanter": 2**16 - 1, None: 2**24}


def mixture_schedule(
    lengths: Mapping[str, int],
    weights: Weights,
    *,
    block_size: int,
    key,
    stop_strategy: StopStrategy = "restart",
    compat: Literal["levanter"] | None = None,
) -> MixtureSchedule:
    """A stable mixture's ``(source, index)`` for every row; see the module docstring.

    Args:
        lengths: ``{name: rows}`` of each source; sources are numbered in this order.
        weights: ``{name: weight}``, or stages ``[(start_row, {name: weight}), ...]`` with starts
            on block boundaries (``meshbatch.Mixture`` takes steps and converts them).
        block_size: rows per block; each block holds a fixed count of rows per source.
        key: a typed key or an int seed (Levanter's ``MixtureDataset(key=...)``).
        stop_strategy: ``"restart"``, ``"first_exhausted"`` or ``"all_exhausted"``.
        compat: ``"levanter"`` reproduces ``levanter.data.MixtureDataset`` exactly (restart is
            the only strategy Levanter implements); ``None`` is the improved default
            (``docs/mixtures.md``).

    Returns:
        A ``MixtureSchedule`` whose jitted ``lookup(rows)`` gives ``(source int32, index uint32)``.

    Raises:
        ValueError: bad weights or stages, a block_size out of range, a finite mixture longer
            than ``2**32 - 1`` rows, or an ``all_exhausted`` source that never finishes.
    """
    compat = check_choice("compat", compat, ("levanter", None))
    stop_strategy = check_choice("stop_strategy", stop_strategy, STRATEGIES)
    lengths = check_lengths(lengths)
    names = list(lengths)
    block_size = check_int("block_size", block_size, low=1, high=MAX_BLOCK_SIZE[compat])
    stages = check_stages(names, weights, block_size=block_size)
    key = as_key(key)

    counts = np.stack([block_counts(names, w, block_size=block_size, compat=compat) for _, w in stages])
    starts = [start // block_size for start, _ in stages]
    if starts[-1] > 2**32 - 1:
        raise ValueError(f"the last stage starts at block {starts[-1]} >= 2**32")
    reads = [np.zeros(len(names), dtype=object)]  # Python ints: reads before each stage
    for i in range(1, len(stages)):
        reads.append(reads[-1] + counts[i - 1].astype(object) * (starts[i] - starts[i - 1]))
    length_arr = np.asarray(list(lengths.values()), dtype=object)
    base_wrap = np.stack([r // length_arr for r in reads])
    if int(base_wrap.max()) > 2**32 - 1:
        raise ValueError("a source wraps more than 2**32 - 1 times before the last stage")
    first = np.concatenate([np.zeros((len(stages), 1), np.int64), np.cumsum(counts, axis=1)[:, :-1]], axis=1)
    schedule = MixtureSchedule(
        key=key,
        lengths=_pad(np.asarray(list(lengths.values()), np.int64), fill=1),
        stage_start=_pad(np.asarray(starts, np.int64), fill=2**32 - 1, axis=0),
        counts=_pad(counts, fill=0),
        first=_pad(first, fill=block_size),
        base_wrap=_pad(base_wrap.astype(np.int64), fill=0),
        base_index=_pad(np.stack([r % length_arr for r in reads]).astype(np.int64), fill=0),
        passes=_pad(np.ones(len(names), np.int64), fill=1),
        num_rows=jnp.asarray(((2**32 - 1) // block_size) * block_size, jnp.uint32),
        block_size=jnp.asarray(block_size, jnp.uint32),
        sort_size=block_size if compat == "levanter" else None,
        compat=compat,
        finite=False,
    )
    if stop_strategy == "restart":
        return schedule
    return _finite(schedule, names, lengths, counts, starts, reads, stop_strategy)


def _finite(schedule: MixtureSchedule, names, lengths, counts, starts, reads, strategy) -> MixtureSchedule:
    """``schedule`` cut to the length ``strategy`` gives, with each source's wraps per pass."""
    block_size = int(schedule.block_size)
    first = np.asarray(schedule.first).astype(np.int64)

    def row_of_read(s: int, read: int, *, after: bool) -> int | None:
        """The first row making a read numbered ``>= read`` of source ``s`` (``after``), or the
        last row making one ``<= read``; None if the source never makes read ``read``.

        Reads are numbered in block order, but a block permutes its rows: read ``read + 1`` may
        come before read ``read`` in the same block.
        """
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else None
            count = int(counts[i, s])
            if count == 0 or read < reads[i][s]:
                continue
            k, rank = divmod(read - int(reads[i][s]), count)
            if end is not None and start + k >= end:
                continue
            block = start + k
            ranks = _ids_of_block(schedule, block).astype(np.int64) - int(first[i, s])
            if after:
                position = int(np.flatnonzero((ranks >= rank) & (ranks < count)).min())
            else:
                position = int(np.flatnonzero((ranks >= 0) & (ranks <= rank)).max())
            return block * block_size + position
        return None

    if strategy == "first_exhausted":
        ends = [row_of_read(s, lengths[name], after=True) for s, name in enumerate(names)]
        num_rows = min(row for row in ends if row is not None)
    else:
        ends = []
        for s, name in enumerate(names):
            row = row_of_read(s, lengths[name] - 1, after=False)
            if row is None:
                raise ValueError(
                    f"source {name!r} gets no rows in the last stage and never finishes "
                    f"({lengths[name]} rows): stop_strategy='all_exhausted' would never end"
                )
            ends.append(row)
        num_rows = max(ends) + 1
    if num_rows > 2**32 - 1:
        raise ValueError(f"the {strategy} mixture has {num_rows} rows, more than 2**32 - 1")
    if num_rows == 0:
        raise ValueError("the first_exhausted mixture is empty: a source runs out at row 0")
    passes = [
        max(1, -(-_reads_before(schedule, counts, starts, reads, s, num_rows) // lengths[name]))
        for s, name in enumerate(names)
    ]
    return dataclasses.replace(
        schedule,
        passes=_pad(np.asarray(passes, np.int64), fill=1),
        num_rows=jnp.asarray(num_rows, jnp.uint32),
        finite=True,
    )


# Tables are padded to these multiples of sources and stages (padding sources never appear,
# padding stages start at block 2^32 - 1), so mixtures of similar shape share one compiled lookup.
SOURCE_PAD, STAGE_PAD = 8, 4


def _pad(table: np.ndarray, *, fill: int, axis: int = -1) -> jnp.ndarray:
    """``table`` as uint32, padded along ``axis`` (sources: last; stages: first) and, for a 2-D
    table, along the stages axis too (those rows are never read)."""
    table = np.asarray(table, np.int64)
    widths = [(0, 0)] * table.ndim
    multiple = STAGE_PAD if (axis == 0 and table.ndim == 1) else SOURCE_PAD
    widths[axis] = (0, -table.shape[axis] % multiple)
    if table.ndim == 2:
        widths[0] = (0, -table.shape[0] % STAGE_PAD)
    return jnp.asarray(np.pad(table, widths, constant_values=fill), jnp.uint32)


def _ids_of_block(schedule: MixtureSchedule, block: int) -> np.ndarray:
    """Host: the in-block ids of every position of ``block`` (evaluated in fixed-size calls)."""
    size = int(schedule.block_size)
    chunk = 1024
    out = []
    for start in range(0, size, chunk):
        positions = np.arange(start, start + chunk) % size  # wrapped padding: valid positions
        blocks = jnp.full(chunk, block, jnp.uint32)
        out.append(np.asarray(_block_ids_jit(schedule, blocks, jnp.asarray(positions, jnp.uint32))))
    return np.concatenate(out)[:size]


_block_ids_jit = jax.jit(mixture_block_ids)


def _reads_before(schedule, counts, starts, reads, s: int, row: int) -> int:
    """Reads of source ``s`` in rows ``[0, row)``."""
    size = int(schedule.block_size)
    block, position = divmod(row, size)
    stage = int(np.searchsorted(np.asarray(starts), block, side="right") - 1)
    before = int(reads[stage][s]) + (block - starts[stage]) * int(counts[stage, s])
    if position == 0:
        return before
    ids = _ids_of_block(schedule, block)[:position]
    low = int(schedule.first[stage, s])
    return before + int(np.sum((ids >= low) & (ids < low + int(counts[stage, s]))))
