"""``mixture_schedule``: a stable mixture of named sources as a device row map.

    schedule = meshbatch.mixture_schedule({"web": 1000, "code": 300}, {"web": 0.7, "code": 0.3},
                                          block_size=10, key=0)
    source, index = schedule.lookup(jnp.arange(20, dtype=jnp.uint32))
    # every block of 10 rows: 7 rows of web, 3 of code, in a keyed order per block

Stop strategies (what happens when a source runs out):

- ``"restart"`` (Levanter's): a source that runs out starts over (``index = reads mod length``,
  the source's epoch counts the wraps); the mixture never ends.
- ``"first_exhausted"``: the mixture is the whole blocks in which no source reads past its end:
  it stops before the first block that would make a source wrap. No row ever wraps.
- ``"all_exhausted"``: the mixture is the fewest whole blocks in which every source has read all
  of its items; sources that finish earlier restart (wrap) meanwhile. A source with no rows in the
  last stage would never finish: an error.

Both cut at block boundaries, so the length depends on lengths, weights and block size only, not
on the key (a dataset knows it before it sees a key), and every block keeps its exact counts:

    lengths a=5, b=9; counts per block a=2, b=2 (block_size 4)
    reads after 1, 2, 3 blocks: a 2, 4, 6; b 2, 4, 6 ...
    first_exhausted: a would read past 5 in block 3 -> 2 blocks, 8 rows
    all_exhausted:   b has read 9 after 5 blocks    -> 5 blocks, 20 rows
                     (a reads 10 = two passes of 5; b 10: its first item twice, 2 passes)

A finite mixture repeated over epochs replays the same ``(source, index)`` rows; each source's
epoch moves on by its wraps per pass, so a source that reshuffles per epoch reads a new order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from meshbatch.arguments import as_key, check_choice, check_int
from meshbatch.kernels.internal import MixtureSchedule

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
    rows = mixture_rows(lengths, weights, block_size=block_size, stop_strategy=stop_strategy, compat=compat)
    return MixtureSchedule(key=as_key(key), **rows)


def mixture_rows(
    lengths: Mapping[str, int],
    weights: Weights,
    *,
    block_size: int,
    stop_strategy: StopStrategy = "restart",
    compat: Literal["levanter"] | None = None,
) -> dict:
    """Every field of ``mixture_schedule``'s ``MixtureSchedule`` but its key (the rows, and so the
    mixture's length, never depend on it): a dataset sizes itself before it sees a key.

    Raises:
        ValueError: as ``mixture_schedule``.
    """
    compat = check_choice("compat", compat, ("levanter", None))
    stop_strategy = check_choice("stop_strategy", stop_strategy, STRATEGIES)
    lengths = check_lengths(lengths)
    names = list(lengths)
    block_size = check_int("block_size", block_size, low=1, high=MAX_BLOCK_SIZE[compat])
    stages = check_stages(names, weights, block_size=block_size)

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
    schedule = dict(
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


def _finite(schedule: dict, names, lengths, counts, starts, reads, strategy) -> dict:
    """``schedule``'s fields cut to the whole blocks ``strategy`` gives, with each source's wraps
    per pass."""
    block_size = int(schedule["block_size"])

    def reads_after(s: int, blocks: int) -> int:
        """Reads of source ``s`` in the first ``blocks`` blocks."""
        i = int(np.searchsorted(np.asarray(starts), blocks, side="right") - 1)
        return int(reads[i][s]) + (blocks - starts[i]) * int(counts[i, s])

    def blocks_until(s: int, target: int, *, exceed: bool) -> int | None:
        """Fewest blocks after which ``s`` has made ``> target`` reads (``exceed``) or ``>= target``
        reads; None if it never does."""
        goal = target + 1 if exceed else target
        for i, start in enumerate(starts):
            count = int(counts[i, s])
            end = starts[i + 1] if i + 1 < len(starts) else None
            if count == 0 or (end is not None and reads_after(s, end) < goal):
                continue
            return start + max(0, -(-(goal - int(reads[i][s])) // count))
        return None

    if strategy == "first_exhausted":
        ends = [blocks_until(s, lengths[name], exceed=True) for s, name in enumerate(names)]
        blocks = min(b for b in ends if b is not None) - 1  # the last block no source overruns
        if blocks < 1:
            name = names[ends.index(blocks + 1)]
            raise ValueError(
                f"source {name!r} ({lengths[name]} rows) runs out inside the first block: "
                "stop_strategy='first_exhausted' leaves no whole block"
            )
    else:
        ends = []
        for s, name in enumerate(names):
            b = blocks_until(s, lengths[name], exceed=False)
            if b is None:
                raise ValueError(
                    f"source {name!r} gets no rows in the last stage and never finishes "
                    f"({lengths[name]} rows): stop_strategy='all_exhausted' would never end"
                )
            ends.append(b)
        blocks = max(ends)
    num_rows = blocks * block_size
    if num_rows > 2**32 - 1:
        raise ValueError(f"the {strategy} mixture has {num_rows} rows, more than 2**32 - 1")
    passes = [max(1, -(-reads_after(s, blocks) // lengths[name])) for s, name in enumerate(names)]
    return dict(
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
    # converted on the host and placed: an on-device conversion would compile once per shape
    return jax.device_put(np.pad(table, widths, constant_values=fill).astype(np.uint32))
