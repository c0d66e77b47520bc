"""A dataset made of named child datasets: their plans per row, their spans, their builds.

A mixture decides, for each row, a child and the child's row (its ``position`` and ``epoch``).
``Composite`` turns that into everything else by delegating to the children:

    children a (cache A, windows), b (cache B, windows); decided: rows -> (a, 5), (b, 0), (a, 2)
    make     a and b are alike (same kind and configuration, tables of the same shapes): one
             stack, their tables (keys, lengths) along a source axis [a, b]
    plan     each row gathers its child's tables from the stack and is planned once: [a5, b0, a2]
    spans    a's spans of rows 0 and 2 (source A), b's of row 1 (source B) -> one Spans
    fetch    A read coalesced, B read coalesced, one ts.Batch (the pipeline's)
    build    one build per group of alike children; each row keeps its own group's build

Children that are not alike (another kind, another shuffle, tables of other shapes) are stacks of
one: such a child plans every row, and rows that are not its own read its row 0 and are never
used. So a mixture of 256 shuffled caches plans with one copy of the shuffle, as one cache does.

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

import dataclasses
import zlib
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray, UInt32

from meshbatch.datasets.protocol import (
    Content,
    Dataset,
    DeviceDataset,
    Plan,
    Rows,
    Spans,
    gather_members,
    replace,
)
from meshbatch.datasets.provenance import RowSources, content_fingerprint
from meshbatch.kernels import Batch
from meshbatch.kernels.internal import WRAPPED, KeyedShuffle


def derive_keys(key: PRNGKeyArray, names) -> tuple[PRNGKeyArray, dict[str, PRNGKeyArray]]:
    """``(mixture key, {name: child key})`` from the pipeline's key; see the module docstring."""
    mixture_key, children_key = jax.random.split(key)
    return mixture_key, child_keys(children_key, names)


def child_keys(children_key: PRNGKeyArray, names) -> dict[str, PRNGKeyArray]:
    """``{name: fold_in(children_key, crc32(name))}``: the children's half of ``derive_keys``."""
    names = list(names)
    crcs = np.asarray([zlib.crc32(name.encode()) for name in names], np.uint32)
    # one fold_in over every name, then each key placed from its data: no per-child dispatch
    data = np.asarray(jax.random.key_data(_fold_in_names(children_key, crcs)))
    impl = jax.random.key_impl(children_key)
    return {name: jax.random.wrap_key_data(data[i], impl=impl) for i, name in enumerate(names)}


@jax.jit
def _fold_in_names(key: PRNGKeyArray, crcs: UInt32[Array, " n"]) -> PRNGKeyArray:
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, crcs)


class MixturePlan(eqx.Module):
    """A mixture's plan detail: one child plan per build group (each row from its own child's
    plan), which group each child is in, and (token-balanced) each row's real tokens."""

    groups: tuple[Plan, ...]
    group_of: tuple[int, ...] = eqx.field(static=True)
    tokens: Int[Array, " n"] | None = None

    def of(self, c: int) -> Plan:
        """Child ``c``'s plan (valid on the rows whose source is ``c``). Host code calls it through
        the class, ``MixturePlan.of(detail, c)``: a module's bound method is a module of its own,
        whose construction flattens the whole plan."""
        return self.groups[self.group_of[c]]


class CompositeDevice(DeviceDataset):
    """The device half of a mixture: the children's device halves, stacked where alike, and how
    they build.

    Attributes:
        stacks: one device half per stack of alike children (``stack_children``): the members'
            tables stacked along a leading source axis; a stack of one is the child as it is.
        members: the children of each stack, in the mixture's order.
        groups: children sharing a build call (equal builders), each group's lead first.
        child_spans: span slots per row of each child, ``0`` for a child that does not fetch.
    """

    stacks: tuple[DeviceDataset, ...]
    members: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    groups: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    child_spans: tuple[int, ...] = eqx.field(static=True)

    @property
    def num_children(self) -> int:
        return len(self.child_spans)

    @property
    def group_of(self) -> tuple[int, ...]:
        return _index_of(self.groups, self.num_children)

    @property
    def stack_of(self) -> tuple[int, ...]:
        return _index_of(self.members, self.num_children)

    def child(self, c: int) -> DeviceDataset:
        """Child ``c``'s own device half (its slice of its stack)."""
        s = self.stack_of[c]
        if len(self.members[s]) == 1:
            return self.stacks[s]
        i = self.members[s].index(c)
        return jax.tree.map(lambda leaf: leaf[i] if eqx.is_array(leaf) else leaf, self.stacks[s])

    @property
    def children(self) -> tuple[DeviceDataset, ...]:
        """Every child's own device half, in the mixture's order."""
        return tuple(self.child(c) for c in range(self.num_children))

    def _stack_rows(self, s: int, source: Int[Array, " n"]) -> tuple[Array, Array]:
        """``(mine, member)`` of each row for stack ``s``: whether the row's child is in it, and
        the child's place in the stack (``0`` for rows of other children)."""
        place = np.full(self.num_children, -1, np.int32)
        place[list(self.members[s])] = np.arange(len(self.members[s]), dtype=np.int32)
        clipped = jnp.clip(source, 0, self.num_children - 1)
        member = jnp.asarray(place)[clipped]
        mine = (member >= 0) & (clipped == source)
        return mine, jnp.where(mine, member, 0)

    def child_plans(
        self, source: Int[Array, " n"], position: UInt32[Array, " n"], epoch: UInt32[Array, " n"]
    ) -> tuple[Plan, ...]:
        """Each stack's plan of every row (see the module docstring): a row of a child in the stack
        is planned by that child, its tables gathered from the stack."""
        plans = []
        for s, stack in enumerate(self.stacks):
            mine, member = self._stack_rows(s, source)
            rows = Rows(jnp.where(mine, position, jnp.uint32(0)), jnp.where(mine, epoch, jnp.uint32(0)))
            if len(self.members[s]) == 1:
                plan, _ = stack.plan(rows, None)
            else:
                plan = stack.plan_members(member, rows)
            plans.append(plan)
        return tuple(plans)

    def group_plans(self, source: Int[Array, " n"], plans: tuple[Plan, ...], tokens=None) -> MixturePlan:
        """One plan per build group from the stacks' plans (``child_plans``): each row from its
        own child's stack."""
        stack_of = self.stack_of
        row_stack = jnp.asarray(np.asarray(stack_of, np.int32))[jnp.clip(source, 0, self.num_children - 1)]
        out = []
        for group in self.groups:
            stacks = list(dict.fromkeys(stack_of[c] for c in group))  # the lead's stack first
            merged = plans[stacks[0]]
            for s in stacks[1:]:
                merged = _select(row_stack == s, plans[s], merged)
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
            built = self.child(lead).build(plan.detail.groups[g], child_content)
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
        for s, stack in enumerate(self.stacks):
            members = self.members[s]
            if len({self.group_of[c] for c in members}) == 1:  # the stack's rows are in one plan
                mine, member = self._stack_rows(s, plan.source)
                child_plan = plan.detail.of(members[0])
                if len(members) == 1:
                    tokens = stack.real_tokens(child_plan)
                else:
                    tokens = _tokens_per_row(gather_members(stack, member), child_plan)
                out = jnp.where(mine, tokens.astype(jnp.int32), out)
                continue
            for c in members:
                tokens = self.child(c).real_tokens(plan.detail.of(c)).astype(jnp.int32)
                out = jnp.where(plan.source == c, tokens, out)
        return out


def _index_of(parts: tuple[tuple[int, ...], ...], n: int) -> tuple[int, ...]:
    """For each of ``n`` items, the index of the part holding it."""
    out = [0] * n
    for p, part in enumerate(parts):
        for c in part:
            out[c] = p
    return tuple(out)


@eqx.filter_vmap
def _tokens_per_row(device: DeviceDataset, plan: Plan) -> Int[Array, ""]:
    """Each row's real tokens by its own device half."""
    one = jax.tree.map(lambda leaf: leaf[None] if eqx.is_array(leaf) else leaf, plan)
    return device.real_tokens(one)[0]


def stack_children(devices) -> tuple[tuple[tuple[int, ...], ...], tuple[DeviceDataset, ...]]:
    """``(members, stacks)``: children whose device halves are alike (the same type and static
    configuration, tables of the same shapes and dtypes) stacked into one device half, their
    tables along a new leading axis, so a plan gathers each row's tables and plans every child at
    once. The first child of each stack leads; the rest keep the mixture's order.

        children: causal windows of caches A, B (full shuffle), C (no shuffle), D (full shuffle)
        members ((0, 1, 3), (2,)): A, B, D stacked (keys and lengths [3]); C on its own
    """
    parts = [eqx.partition(device, eqx.is_array) for device in devices]  # (arrays, the rest)

    def shapes(arrays) -> tuple:
        leaves, treedef = jax.tree.flatten(arrays)
        return treedef, tuple((leaf.shape, leaf.dtype) for leaf in leaves)

    members = _group_alike(
        [(shapes(arrays), rest) for arrays, rest in parts],
        lambda a, b: a[0] == b[0] and bool(eqx.tree_equal(a[1], b[1])),
    )
    stacks = []
    for part in members:
        if len(part) == 1:
            stacks.append(devices[part[0]])
            continue
        stacked = jax.tree.map(lambda *leaves: _stack(leaves), *(parts[c][0] for c in part))
        stacks.append(_with_orders(eqx.combine(stacked, parts[part[0]][1])))
    return tuple(tuple(m) for m in members), tuple(stacks)


def _is_shuffle(x) -> bool:
    return isinstance(x, KeyedShuffle)


def _with_orders(stack: DeviceDataset) -> DeviceDataset:
    """A stack's shuffles with their short orders as tables (``KeyedShuffle.with_orders``): each
    row of a stack is shuffled by its own member, so without them every row of a small member
    walks its own network (docs/shuffles.md). The same orders; one program for the whole stack."""
    return jax.tree.map(lambda x: x.with_orders() if _is_shuffle(x) else x, stack, is_leaf=_is_shuffle)


class Composite(Dataset):
    """Base of mixtures (the host half): named stateless children; see the module docstring.

    Subclasses decide ``(child, position, epoch)`` per row in their device half (a
    ``CompositeDevice``: ``child_plans`` then ``group_plans``), which ``make_children`` fills.
    """

    names: list[str]
    children: list[Dataset]
    seq_len: int
    source_table: np.ndarray  # [children, width]: a child's source index -> ours
    max_row_tokens: int
    spans_per_row: int
    span_group_cache: dict  # group_of -> _span_groups (filled on first use)

    def __init__(self, datasets: Mapping[str, Dataset]):
        if not isinstance(datasets, Mapping) or not datasets:
            raise ValueError(f"datasets must be a non-empty dict of name -> Dataset (got {datasets!r})")
        for name, child in datasets.items():
            if not isinstance(name, str):
                raise TypeError(f"datasets names must be strings (got {name!r})")
            if not isinstance(child, Dataset):
                got = type(child).__name__
                raise TypeError(f"datasets[{name!r}] must be a meshbatch Dataset (got {got})")
            if child.init_state() is not None:
                raise ValueError(f"datasets[{name!r}] carries state; a mixture's children must be stateless")
        crcs = [zlib.crc32(name.encode()) for name in datasets]
        if len(set(crcs)) != len(crcs):
            raise ValueError(f"two names of {list(datasets)} share a crc32: their keys would collide")
        self.names = list(datasets)
        for field, value in _children_fields(self.names, list(datasets.values())).items():
            setattr(self, field, value)

    # -- for subclasses -------------------------------------------------------------------------

    def derive_keys(self, key: PRNGKeyArray) -> tuple[PRNGKeyArray, dict[str, PRNGKeyArray]]:
        """``(mixture key, {name: child key})``; override to map another library's derivation."""
        return derive_keys(key, self.names)

    def make_children(self, key: PRNGKeyArray) -> tuple[PRNGKeyArray, dict, Composite]:
        """The mixture's key (``derive_keys``) and the children's halves for theirs:
        ``CompositeDevice``'s fields (``stacks``, ``members``, ``groups``, ``child_spans``) and the
        host half (``self`` unless a child's host half is another value, e.g. made for its key)."""
        mixture_key, keys = self.derive_keys(key)
        made = [child.make(keys[name]) for name, child in zip(self.names, self.children, strict=True)]
        devices = tuple(device for device, _ in made)
        hosts = [host for _, host in made]
        host = self
        if any(h is not c for h, c in zip(hosts, self.children, strict=True)):
            host = replace(self, **_children_fields(self.names, hosts))  # a new value over them
        members, stacks = stack_children(devices)
        fields = dict(
            stacks=stacks,
            members=members,
            groups=_build_groups(devices),
            child_spans=tuple(h.spans_per_row if h.fetches else 0 for h in hosts),
        )
        return mixture_key, fields, host

    # -- the dataset protocol -------------------------------------------------------------------

    def spans(self, plan: Plan) -> Spans:
        """The rows' children's spans, their sources renumbered to ``self.sources``."""
        source = self._planned_sources(plan)
        n, width = source.shape[0], self.spans_per_row
        out = Spans(
            np.zeros((n, width), np.int32), np.zeros((n, width), np.int64), np.zeros((n, width), np.int64)
        )
        for members in self._span_groups(plan.detail.group_of):
            lead = self.children[members[0]]
            mine = np.isin(source, members) if len(members) > 1 else source == members[0]
            if not lead.fetches or not mine.any():
                continue
            lead_plan = MixturePlan.of(plan.detail, members[0])
            mine_only = jax.tree.map(lambda leaf, mine=mine: np.asarray(leaf)[mine], lead_plan)
            part = lead.spans(mine_only)
            k = part.source.shape[1]
            out.source[mine, :k] = self.source_table[source[mine][:, None], part.source]
            out.start[mine, :k] = part.start
            out.length[mine, :k] = part.length
        return out

    def provenance(self, plan: Plan) -> RowSources:
        """Each row's component (its name; a nested mixture's ``outer/inner``) and where that
        child's row comes from (the child's ``provenance`` of its rows); no token is read."""
        source = self._planned_sources(plan)
        parts = []
        for c, (name, child) in enumerate(zip(self.names, self.children, strict=True)):
            mine = np.flatnonzero(source == c)
            if mine.size:
                sub = jax.tree.map(
                    lambda leaf, mine=mine: np.asarray(leaf)[mine], MixturePlan.of(plan.detail, c)
                )
                part = child.provenance(sub)
                part.component[:] = [name if not inner else f"{name}/{inner}" for inner in part.component]
                parts.append((mine, part))
        out = RowSources.empty(source.shape[0], max((p.slots for _, p in parts), default=1))
        for mine, part in parts:
            out.put(mine, part)
        return out

    def content_fingerprint(self) -> str:
        """``meshbatch.datasets.provenance.content_fingerprint`` of the mixture."""
        return content_fingerprint(self)

    def _planned_sources(self, plan: Plan) -> np.ndarray:
        """The plan's child of each row; a row without one (``-1``: past the end of a finite
        mixture; ``WRAPPED``) is refused, naming it."""
        source = np.asarray(plan.source)
        if source.size and source.min() < 0:
            bad = int(np.flatnonzero(source < 0)[0])
            if source[bad] == WRAPPED:
                raise OverflowError(
                    f"row {bad} of the batch: its source would start its 2^32-th pass (a source's "
                    f"epoch is 32 bits; a source of few rows gets there first) in {self!r}"
                )
            raise IndexError(f"row {bad} of the batch lies past the end of the mixture ({self!r})")
        return source

    def _span_groups(self, group_of: tuple[int, ...]) -> list[list[int]]:
        """Children whose spans one call reads (equal ``spans_key``, one build group's plan): a
        step reads every causal child's spans at once, whatever the number of children."""
        found = self.span_group_cache.get(group_of)
        if found is None:
            groups: dict = {}
            for c, child in enumerate(self.children):
                key = child.spans_key()
                groups.setdefault((c,) if key is None else (key, group_of[c]), []).append(c)
            found = self.span_group_cache[group_of] = list(groups.values())
        return found

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(zip(self.names, self.children, strict=True))})"


def _children_fields(names: list[str], children: list[Dataset]) -> dict:
    """A composite's fields that derive from its children: ``seq_len`` (theirs, one value), the
    union of their sources (each once, by identity) and a table from each child's source indices
    into it, and the fetch shape (the widest child's)."""
    lengths = {child.seq_len for child in children}
    if len(lengths) != 1:
        seq = {name: getattr(child, "seq_len", None) for name, child in zip(names, children, strict=True)}
        raise ValueError(f"datasets build rows of different seq_len: {seq}")
    sources, source_maps = [], []
    for child in children:
        indices = []
        for source in child.sources:
            found = next((i for i, s in enumerate(sources) if s is source), None)
            if found is None:
                sources.append(source)
                found = len(sources) - 1
            indices.append(found)
        source_maps.append(np.asarray(indices, np.int32))
    width = max((len(m) for m in source_maps), default=0)
    table = np.zeros((len(children), max(width, 1)), np.int32)
    for c, indices in enumerate(source_maps):
        table[c, : len(indices)] = indices
    fetching = [child for child in children if child.fetches]
    return dict(
        children=list(children),
        seq_len=lengths.pop(),
        sources=tuple(sources),
        source_table=table,
        span_group_cache={},
        spans_per_row=max((c.spans_per_row for c in fetching), default=1),
        max_row_tokens=max((c.max_row_tokens for c in fetching), default=0),
        content_margin=max((c.content_margin for c in fetching), default=0),
    )


def _stack(leaves) -> Array:
    """Equal-shaped arrays stacked on the host and placed (a ``jnp.stack`` would compile once per
    number of children); typed keys by their key data."""
    first = leaves[0]
    if jax.dtypes.issubdtype(first.dtype, jax.dtypes.prng_key):
        data = np.stack([np.asarray(jax.random.key_data(leaf)) for leaf in leaves])
        return jax.random.wrap_key_data(jax.device_put(data), impl=jax.random.key_impl(first))
    return jax.device_put(np.stack([np.asarray(leaf) for leaf in leaves]))


def _build_groups(devices) -> tuple[tuple[int, ...], ...]:
    """Children sharing a build call: equal builders (``eqx.tree_equal``), first child leads."""
    groups = _group_alike([device.builder() for device in devices], lambda a, b: bool(eqx.tree_equal(a, b)))
    return tuple(tuple(g) for g in groups)


def _group_alike(items: list, alike) -> list[list[int]]:
    """The indices of ``items`` in groups: each item joins the first group whose first item it is
    ``alike``, else starts one."""
    groups: list[list[int]] = []
    for c, item in enumerate(items):
        same = next((g for g in groups if alike(items[g[0]], item)), None)
        if same is None:
            groups.append([c])
        else:
            same.append(c)
    return groups


def _select(where: Array, new, old):
    """``new`` on rows where ``where``, else ``old``, leaf by leaf (leaves ``[n, ...]``)."""

    def pick(a, b):
        if a is None:
            return None
        mask = where.reshape(where.shape + (1,) * (a.ndim - 1))
        return jnp.where(mask, a, b)

    return jax.tree.map(pick, new, old, is_leaf=lambda x: x is None)
