"""``Mixture``: Levanter's stable mixture of datasets, on the pipeline, and its row map
``mixture_schedule``.

Row ``r`` of the mixture is ``mixture_schedule``'s ``(child, index, child epoch)``; the child's
own plan turns ``(index, child epoch)`` into its example (so a child's shuffle, and its
per-epoch reshuffle when a source restarts, stay the child's). Reads, builds and real-token
counts go through ``Composite``:

    Mixture({"web": CausalLMDataset(web, 512), "code": CausalLMDataset(code, 512)},
            {"web": 0.75, "code": 0.25}, block_size=4)
    rows 0..3 (one block)  ->  children [web, code, web, web], indices [0, 0, 2, 1]
    plan   web's plan of rows 0, 2, 1 (its shuffle), code's of row 0
    fetch  web's windows from the web cache, code's from the code cache: one ts.Batch

The schedule alone, a stable mixture of named sources as a device row map:

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

Weights are a dict ``{name: weight}`` or stages ``[(start_row, {name: weight}), ...]``; a stage
applies from its start row until the next stage's. ``Mixture`` takes stages by training step,
``[(start_step, {name: weight}), ...]``, and turns them into rows through the batch schedule
(Levanter's ``rescale_mixture_schedule_for_batch_schedule``): each stage must then start on a
block boundary. Each block of ``block_size`` rows holds a fixed
count of rows per source, computed once per stage:

    weights = {"a": 0.05, "b": 0.15, "c": 0.8}, block_size = 10    shares = [0.5, 1.5, 8.0]
    compat="levanter"   truncate, remainder to the largest:   [0, 1, 8] + 1 to c -> [0, 1, 9]
                        (source a is never read; Levanter only warns)
    default             largest remainder (Hamilton):         [0, 1, 8] + 1 to a -> [1, 1, 8]

    weights = {"a": 0.1, "b": 0.2, "c": 0.7}, block_size = 2048   shares = [204.8, 409.6, 1433.6]
    compat="levanter"   [204, 409, 1433] + 2 to c -> [204, 409, 1435]   (c: +1.4 rows per block)
    default             [204, 409, 1433] + 1 to a, 1 to b -> [205, 410, 1433]

The default computes shares as exact fractions of the given floats and gives the remainder one
row at a time to the largest fractional parts (ties: the earlier source), so no source drifts
less than one row per block from its share. Levanter truncates and hands every leftover row (up to
one per source) to the largest source, so small sources lose up to a row per block and a source
with a share below one is never read.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from meshbatch.arguments import as_key, check_choice, check_float, check_int
from meshbatch.batch_schedule import BatchSchedule
from meshbatch.datasets.protocol import Dataset, Plan, Rows
from meshbatch.kernels.internal import MixtureSchedule, mixture_locate

from .composite import Composite, CompositeDevice

logger = logging.getLogger(__name__)

Weights = Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]]

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
        weights: as ``Mixture``'s, but stages start at rows (on block boundaries), not steps.
        key: a typed key or an int seed (Levanter's ``MixtureDataset(key=...)``).
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
    if not isinstance(lengths, Mapping) or not lengths:
        raise ValueError(f"lengths must be a non-empty dict of name -> rows (got lengths={lengths!r})")
    checked = {}
    for name, length in lengths.items():
        if not isinstance(name, str):
            raise TypeError(f"source names must be strings (got {name!r})")
        checked[name] = check_int(f"lengths[{name!r}]", length, low=1, high=2**32 - 1)
    lengths, names = checked, list(checked)
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


def check_stages(names: Sequence[str], weights: Weights, *, block_size: int) -> list[tuple[int, dict]]:
    """The stages ``[(start_row, {name: weight})]`` of ``weights``, checked; see the module docstring.

    A single dict must give every source a positive weight. Stages must each name every source
    (0 turns a source off for that stage), start at row 0, increase strictly, start on a block
    boundary, and give every source a positive weight somewhere.

    Raises:
        ValueError: negative, zero or all-zero weights, unknown or missing names, bad starts.
        TypeError: a weight or start of the wrong type.
    """
    if isinstance(weights, Mapping):
        stages = [(0, weights)]
        single = True
    elif isinstance(weights, Sequence) and not isinstance(weights, str) and weights:
        stages = list(weights)
        single = False
    else:
        raise ValueError(f"weights must be a dict or a non-empty list of (start, dict) (got {weights!r})")
    out = []
    for i, stage in enumerate(stages):
        if not (isinstance(stage, Sequence) and len(stage) == 2 and isinstance(stage[1], Mapping)):
            raise ValueError(f"stage {i} must be a (start_row, {{name: weight}}) pair (got {stage!r})")
        start = check_int(f"stages[{i}] start", stage[0], low=0)
        if i == 0 and start != 0:
            raise ValueError(f"the first stage must start at row 0 (got start={start})")
        if i > 0 and start <= out[-1][0]:
            raise ValueError(f"stage starts must increase strictly (got {start} after {out[-1][0]})")
        if start % block_size:
            raise ValueError(f"stage {i} starts at row {start}, not a multiple of block_size={block_size}")
        out.append((start, _check_stage_weights(names, stage[1], single=single, where=f"stage {i}")))
    for name in names:
        if all(w[name] == 0 for _, w in out):
            raise ValueError(f"source {name!r} has weight 0 in every stage: remove it from the mixture")
    return out


def _check_stage_weights(names, weights: Mapping, *, single: bool, where: str) -> dict:
    unknown = [name for name in weights if name not in names]
    if unknown:
        raise ValueError(f"{where}: weights name unknown source(s) {unknown} (sources: {list(names)})")
    missing = [name for name in names if name not in weights]
    if missing:
        raise ValueError(f"{where}: no weight for source(s) {missing}")
    out = {}
    for name, value in weights.items():  # the caller's order: Levanter sums in it
        value = check_float(f"weight of {name!r}", value, low=0.0)
        if single and value == 0:
            raise ValueError(f"weight of {name!r} is 0: remove the source instead (got {dict(weights)})")
        out[name] = value
    if sum(out.values()) <= 0:
        raise ValueError(f"{where}: weights sum to 0 (got {dict(weights)})")
    return out


def block_counts(names: Sequence[str], weights: Mapping[str, float], *, block_size: int, compat):
    """``int64[sources]`` rows of each source per block (summing to ``block_size``).

    Raises:
        ValueError: (default mode) a source with positive weight would get 0 rows per block.
    """
    if compat == "levanter":
        return _levanter_counts(names, weights, block_size)
    total = sum(Fraction(w) for w in weights.values())
    shares = [Fraction(weights[name]) / total * block_size for name in names]
    counts = [math.floor(s) for s in shares]
    order = sorted(range(len(names)), key=lambda i: (-(shares[i] - counts[i]), i))
    for i in order[: block_size - sum(counts)]:
        counts[i] += 1
    for name, count in zip(names, counts, strict=True):
        if count == 0 and weights[name] > 0:
            raise ValueError(
                f"source {name!r} (weight {weights[name]}) gets 0 of block_size={block_size} rows per "
                "block and would never be read: raise block_size"
            )
    return np.asarray(counts, np.int64)


def _levanter_counts(names, weights, block_size: int) -> np.ndarray:
    """``MixtureDataset._compute_expected_counts_per_block``, float arithmetic and all."""
    total = sum(weights.values())
    normalized = {name: w / total for name, w in weights.items() if w > 0}
    counts = np.zeros(len(names), dtype=np.int32)
    for i, name in enumerate(names):
        counts[i] = normalized.get(name, 0) * block_size  # numpy truncates toward zero
    counts[np.argmax(counts)] += block_size - counts.sum()
    for i, name in enumerate(names):
        if counts[i] == 0 and weights[name] > 0:
            logger.warning(
                "source %r has 0 rows per block despite weight %s (as in Levanter); raise block_size",
                name,
                weights[name],
            )
    return counts.astype(np.int64)


def rows_from_steps(stages: Sequence[tuple[int, Mapping]], offset_of_step) -> list[tuple[int, Mapping]]:
    """Stages by training step -> stages by row, through ``offset_of_step(step)`` (the batch
    schedule's offset): Levanter's ``rescale_mixture_schedule_for_batch_schedule``.

    Raises:
        ValueError: a negative step (Levanter reads ``-1`` as "last"; here it is refused).
    """
    out = []
    for i, (step, weights) in enumerate(stages):
        step = check_int(f"stages[{i}] start_step", step, low=0)
        out.append((offset_of_step(step), weights))
    return out


class MixtureDevice(CompositeDevice):
    """The device half of ``Mixture``: the schedule under the mixture's key, and the children."""

    schedule: MixtureSchedule

    def plan(self, rows: Rows, state=None) -> tuple[Plan, None]:
        """Each row's child and the child's plan; rows past a finite mixture get child ``-1``."""
        source, index, epoch = mixture_locate(self.schedule, rows.position, rows.epoch)
        detail = self.group_plans(source, self.child_plans(source, index, epoch))
        return Plan(rows=rows, source=source, example=index, detail=detail), None


class Mixture(Composite):
    """A stable mixture of named datasets; see the module docstring.

    Args:
        datasets: ``{name: Dataset}``, stateless, all with the same ``seq_len``.
        weights: ``{name: weight}`` or stages ``[(start_step, {name: weight}), ...]``.
        block_size: rows per block; every block holds a fixed count of rows of each child.
        stop_strategy: ``"restart"`` (children wrap), ``"first_exhausted"`` or
            ``"all_exhausted"`` (see the module docstring).
        compat: ``"levanter"``: Levanter's ``MixtureDataset`` rows exactly (except where a source
            reads ``2^31`` rows or more before a later stage: Levanter's int32 count wraps there,
            meshbatch's stays exact; see docs/mixtures.md); ``None``: the default.
        batch_size: the pipeline's batch schedule (an int, pairs or a ``BatchSchedule``);
            needed only to place staged weights, whose starts are steps.

    The mixture takes no key: ``make(key)`` derives its own and each child's from the
    pipeline's (``derive_keys``; a subclass may override it, as ``LevanterKeyedMixture`` of
    ``meshbatch.levanter.mixture_config`` does to reproduce ``LMMixtureDatasetConfig``'s keys).

    Raises:
        ValueError, TypeError: naming the value: bad weights or stages, children of different
            ``seq_len``, a stateful child, staged weights without ``batch_size``.
    """

    rows: dict  # mixture_rows: the schedule's tables that do not depend on the key
    num_examples: int
    block_size: int
    stop_strategy: StopStrategy
    compat: Literal["levanter"] | None
    weights: object  # as given (stages in rows): part of content_fingerprint

    def __init__(
        self,
        datasets: Mapping[str, Dataset],
        weights: Weights,
        *,
        block_size: int = 2048,
        stop_strategy: StopStrategy = "restart",
        compat: Literal["levanter"] | None = None,
        batch_size=None,
    ):
        super().__init__(datasets)
        if not isinstance(weights, Mapping):
            if batch_size is None:
                raise ValueError(
                    "staged weights start at training steps: pass the pipeline's batch_size "
                    "(an int or its schedule) so they can be placed in rows"
                )
            schedule = batch_size if isinstance(batch_size, BatchSchedule) else BatchSchedule(batch_size)
            weights = rows_from_steps(list(weights), schedule.offset)
        lengths = {name: child.num_examples for name, child in zip(self.names, self.children, strict=True)}
        # The rows do not depend on the key (only the in-block orders do): sized without one.
        self.rows = mixture_rows(
            lengths, weights, block_size=block_size, stop_strategy=stop_strategy, compat=compat
        )
        self.num_examples = int(self.rows["num_rows"])
        self.block_size, self.stop_strategy, self.compat = block_size, stop_strategy, compat
        self.weights = weights

    def make(self, key: PRNGKeyArray) -> tuple[MixtureDevice, Composite]:
        """The mixture's schedule under its key and the children's halves under theirs."""
        mixture_key, fields, host = self.make_children(key)
        return MixtureDevice(schedule=MixtureSchedule(key=as_key(mixture_key), **self.rows), **fields), host

    def __repr__(self) -> str:
        return (
            f"Mixture({dict(zip(self.names, self.children, strict=True))}, block_size={self.block_size}, "
            f"stop_strategy={self.stop_strategy!r}, compat={self.compat!r})"
        )
