"""The dataset protocol: everything ``Pipeline`` asks of a dataset, written once.

A dataset maps rows of an endless example stream to rows of a batch in three steps:

    init   (host, once)     key -> tables: the device pytree the kernels close over
    plan   (jitted)         tables, Rows, state -> Plan, state: which example each row reads
    spans  (host)           Plan -> Spans: the token ranges each row needs, per source
    (fetch, the pipeline's: each source read coalesced, all in one batch -> Content per device)
    build  (jitted, shard)  tables, Plan, Content -> Batch

Stream index ``g`` is position ``g mod num_examples`` of epoch ``g // num_examples``; the pipeline
splits it into those two uint32 numbers, so a kernel never sees a 64-bit integer. A trace for
``CausalLMDataset(cache, seq_len=4)`` in cache order, rows 6 and 7 of the stream::

    rows     position = [6, 7], epoch = [0, 0]
    plan     source = [0, 0], example = [6, 7]
    spans    source = [[0], [0]], start = [[24], [28]], length = [[4], [4]]
    fetch    one read of cache tokens [24, 32): tokens = [t24 .. t31], offsets = [[0], [4]]
    build    Batch.tokens = [[t24 t25 t26 t27], [t28 t29 t30 t31]], loss_mask, segment_ids

Datasets without sources keep their tokens on device (a splice document pool): the pipeline skips
fetch, and, when the dataset is stateless, runs plan and build together in the per-shard program.
A dataset with state (the token-balanced interleave) has its plan run over the whole global batch
by every process, in step order, so the state is the same everywhere.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray, PyTree, UInt32

from meshbatch.kernels import Batch

Tables = PyTree
State = PyTree


class Rows(eqx.Module):
    """Stream coordinates of the rows a plan is asked for.

    Attributes:
        position: ``uint32[n]`` position within the epoch, ``< num_examples``.
        epoch: ``uint32[n]`` the epoch of each row (a batch may straddle two).

    Numpy on the host (the pipeline's planner makes them there), jax arrays inside ``plan``.
    """

    position: UInt32[Array | np.ndarray, " n"]
    epoch: UInt32[Array | np.ndarray, " n"]


class Plan(eqx.Module):
    """What a dataset decided for each row; the pipeline slices it by row, so every leaf is
    ``[n, ...]``.

    Attributes:
        rows: the stream coordinates the plan was made for (build stages key on them).
        source: ``int32[n]`` which of the dataset's ``sources`` (or children) the row reads.
        example: ``uint32[n]`` the example within that source: a window, a block, a splice row.
        detail: dataset-specific leaves, each ``[n, ...]`` (splice: ``doc, t, s, copy_len``).
    """

    rows: Rows
    source: Int[Array, " n"]
    example: UInt32[Array, " n"]
    detail: PyTree = None


class Spans(NamedTuple):
    """Host-side token ranges of planned rows: ``spans_per_row`` slots per row (length 0 = unused).

    Attributes:
        source: ``int32[n, k]`` index into the dataset's ``sources``.
        start: ``int64[n, k]`` first token in that source's flat token space.
        length: ``int64[n, k]`` tokens in the span.
    """

    source: np.ndarray
    start: np.ndarray
    length: np.ndarray


class Content(eqx.Module):
    """The fetched tokens of one device's rows: one flat buffer and where each span lies in it.

    ``tokens`` holds ``margin`` zeros, the rows' tokens (the coalesced runs of every source when
    the device's group is the process's only one, each span's tokens in row order otherwise),
    zeros up to the static capacity, and ``margin`` zeros again. A build reads spans only through
    ``offsets``, which says where each row's spans begin.

    Attributes:
        tokens: ``int32[margin + rows * max_row_tokens + margin]``.
        offsets: ``int32[rows, spans_per_row]`` position of each span's first token in ``tokens``.

    Numpy where the host fills it (fetch), jax arrays inside ``build``.
    """

    tokens: Int[Array | np.ndarray, " buffer"]
    offsets: Int[Array | np.ndarray, "rows spans"]


@runtime_checkable  # a return annotation: the shape-checked tests test it with isinstance
class PreparedRead(Protocol):
    """A read a ``TokenSource`` has planned but not run (see ``meshbatch.cache.run_reads``)."""

    span_starts: np.ndarray  # int64[m]: where each requested span begins in the output buffer
    end: int  # first position of the output buffer after this read's tokens


class TokenSource(Protocol):
    """A flat token space the pipeline can read from (``meshbatch.cache.TokenCache`` is one)."""

    @property
    def num_tokens(self) -> int: ...

    def prepare_read(self, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray, at: int) -> PreparedRead:
        """Plans reading spans ``[starts, starts + lengths)`` (coalesced) into ``out[at:]``."""
        ...


class BuildStage(Protocol):
    """A per-shard ``Batch -> Batch`` step after ``build`` (masking, loss weights).

    A stage carries its own key and derives per-row randomness from the plan's stream
    coordinates (``fold_in(key, position)``, then the epoch) or its examples
    (``fold_in(key, example)``), never from a row's place in a shard, so every process and device
    count gives the same result.
    """

    def __call__(self, batch: Batch, plan: Plan) -> Batch: ...


class Dataset(abc.ABC):
    """Base class of pipeline datasets; see the module docstring for how a step flows.

    Attributes (set by subclasses):
        num_examples: examples per epoch, ``1 <= num_examples <= 2**32 - 1``.
        seq_len: tokens per row of the batches ``build`` makes.
        sources: the token sources ``spans`` refers to, by index; empty for device-resident data.
        max_row_tokens: most tokens one row's spans hold together (the fetch capacity per row).
        spans_per_row: span slots per row in ``spans``.
        content_margin: zeros fetch leaves before and after the tokens (lets ``build`` slice
            windows that reach past either end without padding on device).
        length_is_final: ``False`` while a source is still being written (quick start):
            ``num_examples`` is then an upper bound, every row is in epoch 0, and the pipeline
            calls ``wait_for`` before planning a step.
    """

    num_examples: int
    seq_len: int
    sources: tuple[TokenSource, ...] = ()
    max_row_tokens: int = 0
    spans_per_row: int = 1
    content_margin: int = 0
    length_is_final: bool = True

    @property
    def fetches(self) -> bool:
        """Whether the pipeline reads tokens from ``sources`` for each step."""
        return bool(self.sources)

    @abc.abstractmethod
    def init(self, key: PRNGKeyArray) -> Tables:
        """The device tables for ``key`` (a typed threefry key, already checked): shuffles,
        schedules, document pools. Called once per pipeline; never stores the key on ``self``."""

    def init_state(self) -> State | None:
        """The carried state at step 0; ``None`` for a stateless dataset (the default)."""
        return None

    @abc.abstractmethod
    def plan(self, tables: Tables, rows: Rows, state: State | None = None) -> tuple[Plan, State | None]:
        """Each row's example (jitted; rows of one step, or a part of them when stateless).

        Args:
            tables: what ``init`` returned.
            rows: the rows' stream coordinates, in global row order.
            state: the carried state at the start of the step (``None`` when stateless).

        Returns:
            The plan (every leaf ``[n, ...]``) and the state after these rows.
        """

    def spans(self, plan: Plan) -> Spans:
        """Host: the token spans each planned row reads (``plan``'s leaves are numpy)."""
        raise NotImplementedError(f"{type(self).__name__} has no sources to read spans from")

    @abc.abstractmethod
    def build(self, tables: Tables, plan: Plan, content: Content | None) -> Batch:
        """Batch rows from their plan and fetched content (``None`` without sources); jitted,
        per device shard, so it sees only that shard's rows."""

    def build_signature(self) -> Hashable | None:
        """Equal (non-``None``) signatures promise equal ``build`` output for the same plan and
        content whatever the tables, so a mixture builds such children in one call. ``None``
        (the default): never shared."""
        return None

    def real_tokens(self, tables: Tables, plan: Plan) -> Int[Array, " n"]:
        """``int32[n]``: the non-padding tokens each planned row trains on (what a token-balanced
        mixture counts); jitted. Defaults to ``seq_len`` per row."""
        return jnp.full(plan.example.shape, self.seq_len, jnp.int32)

    def wait_for(self, examples: int) -> bool:
        """Blocks until stream rows ``[0, examples)`` can be planned and read (quick start).

        Returns ``True`` once, when the length has just become final: ``num_examples`` is then
        the real length and the pipeline makes the tables again from the same key. A dataset
        whose sources are finished has every row: the default returns ``False`` at once.
        """
        return False

    def state_dict(self, state: State | None) -> dict[str, Any]:
        """A JSON-able checkpoint of ``state`` (empty when stateless)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> State | None:
        """The state a ``state_dict`` describes (``init_state()`` when stateless)."""
        return self.init_state()
