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
from collections.abc import Mapping, Sequence
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
    u32 = jnp.uint32
    schedule = MixtureSchedule(
        key=key,
        lengths=jnp.asarray(np.asarray(list(lengths.values()), np.int64), u32),
        stage_start=jnp.asarray(np.asarray(starts, np.int64), u32),
        counts=jnp.asarray(counts, u32),
        first=jnp.asarray(first, u32),
        base_wrap=jnp.asarray(base_wrap.astype(np.int64), u32),
        base_index=jnp.asarray(np.stack([r % length_arr for r in reads]).astype(np.int64), u32),
        passes=jnp.ones(len(names), u32),
        num_rows=jnp.asarray(((2**32 - 1) // block_size) * block_size, u32),
        block_size=block_size,
        compat=compat,
        finite=False,
    )
    if stop_strategy == "restart":
        return schedule
    return _finite(schedule, names, lengths, counts, starts, reads, stop_strategy)


def _finite(schedule: MixtureSchedule, names, lengths, counts, starts, reads, strategy) -> MixtureSchedule:
    """``schedule`` cut to the length ``strategy`` gives, with each source's wraps per pass."""
    block_size = schedule.block_size

    def row_of_read(s: int, read: int) -> int | None:
        """The row that makes read number ``read`` of source ``s``, or None if none does."""
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else None
            count = int(counts[i, s])
            if count == 0 or read < reads[i][s]:
                continue
            k, rank = divmod(read - int(reads[i][s]), count)
            if end is not None and start + k >= end:
                continue
            block = start + k
            ids = _ids_of_block(schedule, block)
            position = int(np.flatnonzero(ids == int(schedule.first[i, s]) + rank)[0])
            return block * block_size + position
        return None

    if strategy == "first_exhausted":
        ends = [row_of_read(s, lengths[name]) for s, name in enumerate(names)]
        num_rows = min(row for row in ends if row is not None)
    else:
        ends = []
        for s, name in enumerate(names):
            row = row_of_read(s, lengths[name] - 1)
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
        passes=jnp.asarray(np.asarray(passes, np.int64), jnp.uint32),
        num_rows=jnp.asarray(num_rows, jnp.uint32),
        finite=True,
    )


def _ids_of_block(schedule: MixtureSchedule, block: int) -> np.ndarray:
    """Host: the in-block ids of every position of ``block``."""
    size = schedule.block_size
    blocks = jnp.full(size, block, jnp.uint32)
    return np.asarray(_block_ids_jit(schedule, blocks, jnp.arange(size, dtype=jnp.uint32)))


_block_ids_jit = jax.jit(mixture_block_ids)


def _reads_before(schedule, counts, starts, reads, s: int, row: int) -> int:
    """Reads of source ``s`` in rows ``[0, row)``."""
    size = schedule.block_size
    block, position = divmod(row, size)
    stage = int(np.searchsorted(np.asarray(starts), block, side="right") - 1)
    before = int(reads[stage][s]) + (block - starts[stage]) * int(counts[stage, s])
    if position == 0:
        return before
    ids = _ids_of_block(schedule, block)[:position]
    low = int(schedule.first[stage, s])
    return before + int(np.sum((ids >= low) & (ids < low + int(counts[stage, s]))))


def check_rows(schedule: MixtureSchedule, rows: Sequence[int] | np.ndarray) -> None:
    """Raise ``IndexError`` for concrete rows outside ``[0, num_rows)`` of a finite mixture."""
    values = np.asarray(rows)
    if values.size and schedule.finite:
        high = int(values.max())
        if int(values.min()) < 0 or high >= int(schedule.num_rows):
            raise IndexError(f"row {high} is out of range for a mixture of {int(schedule.num_rows)} rows")
