"""A dataset made of named child datasets: their plans per row, their spans, their builds.

A mixture decides, for each row, a child and the child's row (its ``position`` and ``epoch``).
``Composite`` turns that into everything else by delegating to the children:

    children a (cache A, windows), b (cache B, windows); decided: rows -> (a, 5), (b, 0), (a, 2)
    plan     every child plans every row: a's plan of rows [5, 0, 2] and b's of [0, 0, 0]
             (rows that are not a child's read its row 0 and are never used); children that
             build alike keep one plan, each row from its own child: [a5, b0, a2]
    spans    a's spans of rows 0 and 2 (source A), b's of row 1 (source B) -> one Spans
    fetch    A read coalesced, B read coalesced, one ts.Batch (the pipeline's)
    build    one build per group of alike children; each row keeps its own group's build

``sources`` is the children's sources, each once (two children over one cache share it, so its
reads coalesce across them). Children whose device halves have equal builders (``builder()``,
compared with ``eqx.tree_equal``: causal windows of several caches) build alike for the same plan
and content, and share one build call and one plan (the pipeline ships and slices fewer plan
leaves per step); the rest build separately and are selected per row.

Keys: ``derive_keys(key)`` gives the mixture's key and each child's:
``mixture_key, children_key = split(key)``, child ``name`` gets
``fold_in(children_key, crc32(name))``, so adding or removing a child never changes another
child's order (a resumed token-balanced run may add a source). The Levanter drop-in's
``mixture_compat: levanter`` overrides it with Levanter's order-keyed derivation
(``meshbatch.levanter.mixture_config.LevanterKeyedMixture``).
"""

from __future__ import annotations

import copy
import dataclasses
import zlib
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray, UInt32

from meshbatch.datasets.protocol import Content, Dataset, DeviceDataset, Plan, Rows, Spans
from meshbatch.kernels import WRAPPED, Batch


def derive_keys(key: PRNGKeyArray, names) -> tuple[PRNGKeyArray, dict[str, PRNGKeyArray]]:
    """``(mixture key, {name: child key})`` from the pipeline's key; see the module docstring."""
    mixture_key, children_key = jax.random.split(key)
    return mixture_key, child_keys(children_key, names)


def child_keys(children_key: PRNGKeyArray, names) -> dict[str, PRNGKeyArray]:
    """``{name: fold_in(children_key, crc32(name))}``: the children's half of ``derive_keys``."""
    return {name: jax.random.fold_in(children_key, zlib.crc32(name.encode())) for name in names}


class MixturePlan(eqx.Module):
    """A mixture's plan detail: one child plan per build group (each row from its own child's
    plan), which group each child is in, and (token-balanced) each row's real tokens."""

    groups: tuple[Plan, ...]
    group_of: tuple[int, ...] = eqx.field(static=True)
    tokens: Int[Array, " n"] | None = None

    def of(self, c: int) -> Plan:
        """Child ``c``'s plan (valid on the rows whose source is ``c``)."""
        return self.groups[self.group_of[c]]


class CompositeDevice(DeviceDataset):
    """The device half of a mixture: the children's device halves and how they build.

    Attributes:
        children: the children's device halves, in the mixture's order.
        groups: children sharing a build call (equal builders), each group's lead first.
        child_spans: span slots per row of each child, ``0`` for a child that does not fetch.
    """

    children: tuple[DeviceDataset, ...]
    groups: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    child_spans: tuple[int, ...] = eqx.field(static=True)

    @property
    def group_of(self) -> tuple[int, ...]:
        return tuple(
            next(g for g, group in enumerate(self.groups) if c in group) for c in range(len(self.children))
        )

    def child_plans(
        self, source: Int[Array, " n"], position: UInt32[Array, " n"], epoch: UInt32[Array, " n"]
    ) -> tuple[Plan, ...]:
        """Every child's plan of every row; rows of other children read the child's row 0."""
        plans = []
        for c, child in enumerate(self.children):
            mine = source == c
            rows = Rows(jnp.where(mine, position, jnp.uint32(0)), jnp.where(mine, epoch, jnp.uint32(0)))
            plan, _ = child.plan(rows, None)
            plans.append(plan)
        return tuple(plans)

    def group_plans(self, source: Int[Array, " n"], plans: tuple[Plan, ...], tokens=None) -> MixturePlan:
        """One plan per build group: each row from its own child's plan."""
        out = []
        for group in self.groups:
            merged = plans[group[0]]
            for c in group[1:]:
                merged = _select(source == c, plans[c], merged)
            out.append(merged)
        return MixturePlan(tuple(out), self.group_of, tokens)

    def build(self, plan: Plan, content: Content | None) -> Batch:
        """Each row built by its own child (one call per group of equal builders).

        ``doc_idx`` (a document within the row's child) is kept only when every child gives one.
        """
        batch = None
        for g, group in enumerate(self.groups):
            lead = group[0]
            spans = self.child_spans[lead]
            child_content = None
            if spans and content is not None:
                child_content = Content(content.tokens, content.offsets[:, :spans])
            built = self.children[lead].build(plan.detail.groups[g], child_content)
            if batch is None:
                batch = built
                continue
            if (built.doc_idx is None) != (batch.doc_idx is None):  # not every child knows documents
                built, batch = (dataclasses.replace(b, doc_idx=None) for b in (built, batch))
            mine = jnp.isin(plan.source, jnp.asarray(group, jnp.int32))
            batch = _select(mine, built, batch)
        return batch

    def real_tokens(self, plan: Plan) -> Int[Array, " n"]:
        """Each row's child's count of real tokens."""
        out = jnp.zeros(plan.source.shape, jnp.int32)
        for c, child in enumerate(self.children):
            tokens = child.real_tokens(plan.detail.of(c)).astype(jnp.int32)
            out = jnp.where(plan.source == c, tokens, out)
        return out


class Composite(Dataset):
    """Base of mixtures (the host half): named stateless children; see the module docstring.

    Subclasses decide ``(child, position, epoch)`` per row in their device half (a
    ``CompositeDevice``: ``child_plans`` then ``group_plans``), which ``make_children`` fills.
    """

    def __init__(self, datasets: Mapping[str, Dataset], *, what: str = "datasets"):
        if not isinstance(datasets, Mapping) or not datasets:
            raise ValueError(f"{what} must be a non-empty dict of name -> Dataset (got {datasets!r})")
        for name, child in datasets.items():
            if not isinstance(name, str):
                raise TypeError(f"{what} names must be strings (got {name!r})")
            if not isinstance(child, Dataset):
                raise TypeError(f"{what}[{name!r}] must be a meshbatch Dataset (got {type(child).__name__})")
            if child.init_state() is not None:
                raise ValueError(f"{what}[{name!r}] carries state; a mixture's children must be stateless")
        crcs = [zlib.crc32(name.encode()) for name in datasets]
        if len(set(crcs)) != len(crcs):
            raise ValueError(f"two names of {list(datasets)} share a crc32: their keys would collide")
        self.names = list(datasets)
        self._set_children(list(datasets.values()), what)

    def _set_children(self, children: list[Dataset], what: str = "datasets") -> None:
        self.children = children
        lengths = {child.seq_len for child in self.children}
        if len(lengths) != 1:
            seq = {
                name: getattr(child, "seq_len", None)
                for name, child in zip(self.names, self.children, strict=True)
            }
            raise ValueError(f"{what} build rows of different seq_len: {seq}")
        self.seq_len = lengths.pop()
        sources, self.source_maps = [], []
        for child in self.children:
            indices = []
            for source in child.sources:
                found = next((i for i, s in enumerate(sources) if s is source), None)
                if found is None:
                    sources.append(source)
                    found = len(sources) - 1
                indices.append(found)
            self.source_maps.append(np.asarray(indices, np.int32))
        self.sources = tuple(sources)
        fetching = [child for child in self.children if child.fetches]
        self.spans_per_row = max((c.spans_per_row for c in fetching), default=1)
        self.max_row_tokens = max((c.max_row_tokens for c in fetching), default=0)
        self.content_margin = max((c.content_margin for c in fetching), default=0)

    # -- for subclasses -------------------------------------------------------------------------

    def derive_keys(self, key: PRNGKeyArray) -> tuple[PRNGKeyArray, dict[str, PRNGKeyArray]]:
        """``(mixture key, {name: child key})``; override to map another library's derivation."""
        return derive_keys(key, self.names)

    def make_children(self, keys: Mapping[str, PRNGKeyArray]) -> tuple[dict, Composite]:
        """The children's halves for their keys: ``CompositeDevice``'s fields (``children``,
        ``groups``, ``child_spans``) and the host half (``self`` unless a child's host half is
        another value, e.g. made for its key)."""
        made = [child.make(keys[name]) for name, child in zip(self.names, self.children, strict=True)]
        devices = tuple(device for device, _ in made)
        hosts = [host for _, host in made]
        host = self
        if any(h is not c for h, c in zip(hosts, self.children, strict=True)):
            host = copy.copy(self)  # a new value over the children's hosts; self stays as it is
            host._set_children(hosts)
        fields = dict(
            children=devices,
            groups=_build_groups(devices),
            child_spans=tuple(h.spans_per_row if h.fetches else 0 for h in hosts),
        )
        return fields, host

    # -- the dataset protocol -------------------------------------------------------------------

    def spans(self, plan: Plan) -> Spans:
        """The rows' children's spans, their sources renumbered to ``self.sources``."""
        source = np.asarray(plan.source)
        if source.size and source.min() < 0:
            bad = int(np.flatnonzero(source < 0)[0])
            if source[bad] == WRAPPED:
                raise OverflowError(
                    f"row {bad} of the batch: its source would start its 2^32-th pass (a source's "
                    f"epoch is 32 bits; a source of few rows gets there first) in {self!r}"
                )
            raise IndexError(f"row {bad} of the batch lies past the end of the mixture ({self!r})")
        n, width = source.shape[0], self.spans_per_row
        out = Spans(
            np.zeros((n, width), np.int32), np.zeros((n, width), np.int64), np.zeros((n, width), np.int64)
        )
        for c, child in enumerate(self.children):
            mine = source == c
            if not child.fetches or not mine.any():
                continue
            mine_only = jax.tree.map(lambda leaf, mine=mine: np.asarray(leaf)[mine], plan.detail.of(c))
            part = child.spans(mine_only)
            k = part.source.shape[1]
            out.source[mine, :k] = self.source_maps[c][part.source]
            out.start[mine, :k] = part.start
            out.length[mine, :k] = part.length
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(zip(self.names, self.children, strict=True))})"


def _build_groups(devices) -> tuple[tuple[int, ...], ...]:
    """Children sharing a build call: equal builders (``eqx.tree_equal``), first child leads."""
    builders = [device.builder() for device in devices]
    groups: list[list[int]] = []
    for c, builder in enumerate(builders):
        same = next((g for g in groups if bool(eqx.tree_equal(builders[g[0]], builder))), None)
        if same is None:
            groups.append([c])
        else:
            same.append(c)
    return tuple(tuple(g) for g in groups)


def _select(where: Array, new, old):
    """``new`` on rows where ``where``, else ``old``, leaf by leaf (leaves ``[n, ...]``)."""

    def pick(a, b):
        if a is None:
            return None
        mask = where.reshape(where.shape + (1,) * (a.ndim - 1))
        return jnp.where(mask, a, b)

    return jax.tree.map(pick, new, old, is_leaf=lambda x: x is None)
