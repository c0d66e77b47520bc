"""``Mixture``: Levanter's stable mixture of datasets, on the pipeline.

Row ``r`` of the mixture is ``mixture_schedule``'s ``(child, index, child epoch)``; the child's
own plan turns ``(index, child epoch)`` into its example (so a child's shuffle, and its
per-epoch reshuffle when a source restarts, stay the child's). Reads, builds and real-token
counts go through ``Composite``:

    Mixture({"web": CausalLMDataset(web, 512), "code": CausalLMDataset(code, 512)},
            {"web": 0.75, "code": 0.25}, block_size=4)
    rows 0..3 (one block)  ->  children [web, code, web, web], indices [0, 0, 2, 1]
    plan   web's plan of rows 0, 2, 1 (its shuffle), code's of row 0
    fetch  web's windows from the web cache, code's from the code cache: one ts.Batch

Staged weights come by training step, ``[(start_step, {name: weight}), ...]``, and are turned
into rows through the batch schedule (Levanter's ``rescale_mixture_schedule_for_batch_schedule``):
each stage must then start on a block boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from jaxtyping import PRNGKeyArray

from meshbatch.arguments import as_key
from meshbatch.batch_schedule import BatchSchedule
from meshbatch.datasets.protocol import Dataset, Plan, Rows
from meshbatch.kernels.internal import MixtureSchedule, mixture_locate

from .composite import Composite, CompositeDevice
from .mixture_schedule import StopStrategy, Weights, mixture_rows, rows_from_steps


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
            ``"all_exhausted"`` (see ``meshbatch.mixture_schedule``).
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
        mixture_key, child_keys = self.derive_keys(key)
        fields, host = self.make_children(child_keys)
        return MixtureDevice(schedule=MixtureSchedule(key=as_key(mixture_key), **self.rows), **fields), host

    def __repr__(self) -> str:
        return (
            f"Mixture({dict(zip(self.names, self.children, strict=True))}, block_size={self.block_size}, "
            f"stop_strategy={self.stop_strategy!r}, compat={self.compat!r})"
        )
