"""Mixture weights: checking them, staging them, and turning them into rows per block.

Weights are a dict ``{name: weight}`` or stages ``[(start_row, {name: weight}), ...]``; a stage
applies from its start row until the next stage's. Each block of ``block_size`` rows holds a fixed
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

import numpy as np

from meshbatch.arguments import check_float, check_int

logger = logging.getLogger(__name__)

Weights = Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]]


def check_lengths(lengths: Mapping[str, int]) -> dict[str, int]:
    """``{name: rows}`` with string names and ``1 <= rows <= 2**32 - 1``."""
    if not isinstance(lengths, Mapping) or not lengths:
        raise ValueError(f"lengths must be a non-empty dict of name -> rows (got lengths={lengths!r})")
    out = {}
    for name, length in lengths.items():
        if not isinstance(name, str):
            raise TypeError(f"source names must be strings (got {name!r})")
        out[name] = check_int(f"lengths[{name!r}]", length, low=1, high=2**32 - 1)
    return out


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
