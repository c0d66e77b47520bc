"""The dataset protocol: everything ``Pipeline`` asks of a dataset, written once.

A dataset is a value in two halves. What a user constructs (``CausalLMDataset(cache, 4)``, a
mixture, ...) is the host half: configuration, sources and numpy-only ``spans``. For a key it
makes the device half, a frozen ``equinox.Module`` (static fields: configuration; array fields:
tables) whose ``plan`` and ``build`` are pure:

    make   (host, once)     key -> (DeviceDataset, host Dataset): tables for this key
    plan   (jitted)         device.plan(Rows, state) -> Plan, state: which example each row reads
    spans  (host)           host.spans(Plan) -> Spans: the token ranges each row needs, per source
    (fetch, the pipeline's: each source read coalesced, all in one batch -> Content per device)
    build  (jitted, shard)  device.build(Plan, Content) -> Batch

Equal device halves (equal static fields, array fields of equal shapes and dtypes) are one
program to jit: the pipeline's programs are module-level and take the device half as an
argument, so a second pipeline over an equal dataset compiles nothing new.

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

import abc
import os
from typing import Any, NamedTuple, Protocol, runtime_checkable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from equinox import AbstractVar
from jaxtyping import Array, Int, PRNGKeyArray, PyTree, UInt32

from meshbatch.kernels import Batch

from .provenance import RowSources, from_spans

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
        detail: the dataset's own typed module of ``[n, ...]`` leaves (``SplicePlan(doc, t, s,
            copy_len)``, a mixture's children's plans), or ``None``.
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


@runtime_checkable  # annotates every host half's sources: the shape-checked tests test it
class TokenSource(Protocol):
    """A flat token space the pipeline can read from (``meshbatch.cache.TokenCache`` is one)."""

    @property
    def num_tokens(self) -> int: ...

    def prepare_read(self, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray, at: int) -> PreparedRead:
        """Plans reading spans ``[starts, starts + lengths)`` (coalesced) into ``out[at:]``."""
        ...


class BuildStage(Protocol):
    """A per-shard ``Batch -> Batch`` step after ``build`` (masking, loss weights), written as an
    ``equinox.Module`` like the device half (static configuration, array fields such as its key),
    so equal stages share the build program.

    A stage carries its own key and derives per-row randomness from the plan's stream
    coordinates (``fold_in(key, position)``, then the epoch) or its examples
    (``fold_in(key, example)``), never from a row's place in a shard, so every process and device
    count gives the same result.
    """

    def __call__(self, batch: Batch, plan: Plan) -> Batch: ...


class DeviceDataset(eqx.Module):
    """The device half of a dataset: a frozen value whose ``plan`` and ``build`` are pure.

    Static fields hold configuration (``seq_len``, token ids, a ``ShuffleSpec``), array fields the
    tables made for a key (shuffles, schedules, document pools). Two device halves with equal
    static fields and tables of equal shapes are the same program to jit, whatever the key.
    """

    @abc.abstractmethod
    def plan(self, rows: Rows, state: State | None = None) -> tuple[Plan, State | None]:
        """Each row's example (jitted; rows of one step, or a part of them when stateless).

        Args:
            rows: the rows' stream coordinates, in global row order.
            state: the carried state at the start of the step (``None`` when stateless).

        Returns:
            The plan (every leaf ``[n, ...]``) and the state after these rows.
        """

    @abc.abstractmethod
    def build(self, plan: Plan, content: Content | None) -> Batch:
        """Batch rows from their plan and fetched content (``None`` without sources); jitted,
        per device shard, so it sees only that shard's rows."""

    def plan_members(self, member: Int[Array, " n"], rows: Rows) -> Plan:
        """A stateless plan of rows of several alike datasets stacked in ``self`` (every table
        leaf ``[members, ...]``, as a mixture stacks its children): row ``i`` planned by member
        ``member[i]``, exactly as that member's ``plan`` plans it. Default: each row's member
        gathered (``gather_members``) and its one row planned alone, under ``vmap``; a dataset
        whose plan can take a table per row overrides it with one call over all rows."""
        return _plan_per_row(gather_members(self, member), rows)

    def builder(self) -> eqx.Module:
        """The part of this value ``build`` reads. Children of a mixture whose builders are equal
        (``eqx.tree_equal``) build alike for the same plan and content, so they share one build
        call. Default: the whole value (shared only with an equal dataset)."""
        return self

    def real_tokens(self, plan: Plan) -> Int[Array, " n"]:
        """``int32[n]``: the non-padding tokens each planned row trains on (what a token-balanced
        mixture counts); jitted. Defaults to the device half's ``seq_len`` per row."""
        return jnp.full(plan.example.shape, self.seq_len, jnp.int32)

    def tokens_per_row(self) -> int | None:
        """The real tokens of every row when they do not depend on the plan (the default
        ``real_tokens``: ``seq_len``), else ``None``. A token-balanced mixture counts such a
        child's upcoming rows without planning them."""
        return self.seq_len if type(self).real_tokens is DeviceDataset.real_tokens else None


def gather_members(stack: eqx.Module, member: Int[Array, " n"]) -> eqx.Module:
    """Each row's member out of a stack of alike modules (device halves, shuffles): every table
    leaf ``[members, ...]`` becomes ``[n, ...]``."""
    return jax.tree.map(lambda leaf: leaf[member] if eqx.is_array(leaf) else leaf, stack)


@eqx.filter_vmap
def _plan_per_row(device: DeviceDataset, rows: Rows) -> Plan:
    """Each row planned by its own device half (``gather_members``' ``[n, ...]`` tables)."""
    plan, _ = device.plan(Rows(rows.position[None], rows.epoch[None]), None)
    return jax.tree.map(lambda leaf: leaf[0] if eqx.is_array(leaf) else leaf, plan)


class Dataset(eqx.Module):
    """What a user constructs, and the host half of a dataset (numpy only): a frozen value.

    Its fields are declared (an ``equinox.Module``): a subclass's ``__init__`` sets every one of
    them, or construction fails naming the field; after ``__init__`` assigning one raises
    ``dataclasses.FrozenInstanceError``. A value for another key or length is a new value
    (``replace``), never this one changed. Host halves compare and hash by identity (they hold
    sources, which are not values).

    ``make(key)`` gives the device half for a key and the host half that reads for it (``self``
    unless what the host reads depends on the key). When a growing source's length becomes final
    (quick start), ``wait_for`` returns a new, final dataset and the pipeline makes it again.

    Fields:
        num_examples: examples per epoch, ``1 <= num_examples <= 2**32 - 1``.
        seq_len: tokens per row of the batches ``build`` makes.
        max_row_tokens: most tokens one row's spans hold together (the fetch capacity per row).
        spans_per_row: span slots per row in ``spans``.
        sources: the token sources ``spans`` refers to, by index; empty for device-resident data.
        content_margin: zeros fetch leaves before and after the tokens (lets ``build`` slice
            windows that reach past either end without padding on device).
        length_is_final: ``False`` while a source is still being written (quick start):
            ``num_examples`` is then an upper bound, every row is in epoch 0, and the pipeline
            calls ``wait_for`` before planning a step.
    """

    num_examples: AbstractVar[int]
    seq_len: AbstractVar[int]
    max_row_tokens: AbstractVar[int]
    spans_per_row: AbstractVar[int]
    sources: tuple[TokenSource, ...] = eqx.field(default=(), kw_only=True)
    content_margin: int = eqx.field(default=0, kw_only=True)
    length_is_final: bool = eqx.field(default=True, kw_only=True)

    __eq__ = object.__eq__
    __hash__ = object.__hash__
    # Plain attribute access. An equinox module makes each method it hands out a module of its own,
    # which flattens ``self``: a mixture's host half is every child's fields, and the host calls its
    # methods at every step, so that would be host work that grows with the number of sources.
    # A host half never enters a JAX transformation, so its bound methods need not be pytrees.
    __getattribute__ = object.__getattribute__

    @property
    def fetches(self) -> bool:
        """Whether the pipeline reads tokens from ``sources`` for each step."""
        return bool(self.sources)

    @abc.abstractmethod
    def make(self, key: PRNGKeyArray) -> tuple[DeviceDataset, "Dataset"]:
        """``(device half, host half)`` for ``key`` (a typed threefry key, already checked).

        Every table of the device half derives from ``key`` (``fold_in`` per purpose); nothing
        keeps the key but the tables. The host half is ``self`` unless what it reads depends on
        the key (a new value then, e.g. caches packed for it)."""

    def init_state(self) -> State | None:
        """The carried state at step 0; ``None`` for a stateless dataset (the default)."""
        return None

    def spans(self, plan: Plan) -> Spans:
        """Host: the token spans each planned row reads (``plan``'s leaves are numpy arrays)."""
        raise NotImplementedError(f"{type(self).__name__} has no sources to read spans from")

    def provenance(self, plan: Plan) -> RowSources:
        """Host: where each planned row's tokens come from (``meshbatch.datasets.provenance``),
        without reading a token; ``plan``'s leaves are numpy arrays. Default: the rows' spans,
        laid one after another in each row (causal windows, preblocked blocks)."""
        spans = self.spans(plan)
        return from_spans(self.sources, spans.source, spans.start, spans.length, plan.example)

    def spans_key(self) -> object | None:
        """A hashable value such that datasets with equal keys read the same spans for the same
        plan (their sources aside: ``spans``' source indices are each dataset's own). A mixture
        then reads the spans of all such children's rows in one call. ``None`` (the default):
        the dataset's spans are its own."""
        return None

    def wait_for(self, examples: int) -> "Dataset | None":
        """Blocks until stream rows ``[0, examples)`` can be planned and read (quick start).

        Returns the final dataset (a new value: ``num_examples`` the real length) once, when the
        length has just become final; the pipeline then makes it for the same key. ``None``
        otherwise; a dataset whose sources are finished has every row and returns ``None`` at once.
        """
        return None

    def check_state(self, step: int, before: State, after: State) -> None:
        """Host: raises when the step from ``before`` to ``after`` (numpy leaves) must be refused,
        e.g. a count that wrapped. The pipeline calls it after planning each step of a stateful
        dataset, before the step's state or plan is used; planning programs hold no checks that
        need the host (so JAX can keep them in its persistent compilation cache). Default:
        every step is accepted."""
        return None

    def state_dict(self, state: State | None) -> dict[str, Any]:
        """A JSON-able checkpoint of ``state`` (empty when stateless)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> State | None:
        """The state a ``state_dict`` describes (``init_state()`` when stateless)."""
        return self.init_state()


def replace(dataset: Dataset, **changes) -> Dataset:
    """``dataclasses.replace`` for a dataset: a new value whose named fields are ``changes`` and
    whose others are ``dataset``'s (a dataset's ``__init__`` takes its user's arguments, not its
    fields, so this goes through ``equinox.tree_at``); ``dataset`` is unchanged. The new value holds
    the same sources and arrays; nested modules (a mixture's children) are rebuilt as equal copies."""
    names = list(changes)
    return eqx.tree_at(
        lambda d: [getattr(d, name) for name in names],
        dataset,
        [changes[name] for name in names],
        is_leaf=lambda x: x is None,
    )


def check_cache(name: str, value, needs: tuple[str, ...], what: str) -> None:
    """Raises a ``TypeError`` naming ``value`` when it lacks an attribute of ``needs`` (a path
    given where an opened cache is meant gets the call that opens it)."""
    if all(hasattr(value, attr) for attr in needs):
        return
    hint = " (open a path with TokenCache.open(path))" if isinstance(value, str | os.PathLike) else ""
    listed = " and ".join([", ".join(needs[:-1]), needs[-1]] if len(needs) > 1 else needs)
    raise TypeError(f"{name} must be {what} with {listed} (got {name}={value!r}){hint}")
