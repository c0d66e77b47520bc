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
reads coalesce across them). Children whose ``build_signature()`` are equal and not ``None``
promise the same build for the same plan and content whatever their tables, and share one build
call, and one plan (causal windows of several caches: the pipeline ships and slices fewer plan
leaves per step); the rest build separately and are selected per row.

Keys: ``derive_keys(key)`` gives the mixture's key and each child's:
``mixture_key, children_key = split(key)``, child ``name`` gets
``fold_in(children_key, crc32(name))``, so adding or removing a child never changes another
child's order (a resumed token-balanced run may add a source).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray, UInt32

from meshbatch.datasets.protocol import Content, Dataset, Plan, Rows, Spans
from meshbatch.kernels import Batch


def derive_keys(key: PRNGKeyArray, names) -> tuple[PRNGKeyArray, dict[str, PRNGKeyArray]]:
    """``(mixture key, {name: child key})`` from the pipeline's key; see the module docstring."""
    mixture_key, children_key = jax.random.split(key)
    return mixture_key, {name: jax.random.fold_in(children_key, zlib.crc32(name.encode())) for name in names}


class Composite(Dataset):
    """Base of mixtures: named stateless children; see the module docstring.

    Subclasses decide ``(child, position, epoch)`` per row, call ``child_plans`` then
    ``group_plans``; their plans hold ``detail={"groups": group_plans, ...}`` and their tables
    ``{"children": ..., ...}``.
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
        self.children = list(datasets.values())
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
        self.build_groups = _build_groups(self.children)
        self.group_of = [
            next(g for g, group in enumerate(self.build_groups) if c in group)
            for c in range(len(self.children))
        ]

    # -- for subclasses -------------------------------------------------------------------------

    def derive_keys(self, key: PRNGKeyArray) -> tuple[PRNGKeyArray, dict[str, PRNGKeyArray]]:
        """``(mixture key, {name: child key})``; override to map another library's derivation."""
        return derive_keys(key, self.names)

    def init_children(self, keys: Mapping[str, PRNGKeyArray]) -> tuple:
        return tuple(child.init(keys[name]) for name, child in zip(self.names, self.children, strict=True))

    def child_plans(
        self,
        tables: tuple,
        source: Int[Array, " n"],
        position: UInt32[Array, " n"],
        epoch: UInt32[Array, " n"],
    ) -> tuple[Plan, ...]:
        """Every child's plan of every row; rows of other children read the child's row 0."""
        plans = []
        for c, child in enumerate(self.children):
            mine = source == c
            rows = Rows(jnp.where(mine, position, jnp.uint32(0)), jnp.where(mine, epoch, jnp.uint32(0)))
            plan, _ = child.plan(tables[c], rows, None)
            plans.append(plan)
        return tuple(plans)

    def group_plans(self, source: Int[Array, " n"], plans: tuple[Plan, ...]) -> tuple[Plan, ...]:
        """One plan per build group: each row from its own child's plan."""
        out = []
        for group in self.build_groups:
            merged = plans[group[0]]
            for c in group[1:]:
                merged = _select(source == c, plans[c], merged)
            out.append(merged)
        return tuple(out)

    def _plan_of(self, plan: Plan, c: int) -> Plan:
        """Child ``c``'s plan (valid on the rows whose source is ``c``)."""
        return plan.detail["groups"][self.group_of[c]]

    # -- the dataset protocol -------------------------------------------------------------------

    def spans(self, plan: Plan) -> Spans:
        """The rows' children's spans, their sources renumbered to ``self.sources``."""
        source = np.asarray(plan.source)
        if source.size and source.min() < 0:
            bad = int(np.flatnonzero(source < 0)[0])
            raise IndexError(f"row {bad} of the batch lies past the end of the mixture ({self!r})")
        n, width = source.shape[0], self.spans_per_row
        out = Spans(
            np.zeros((n, width), np.int32), np.zeros((n, width), np.int64), np.zeros((n, width), np.int64)
        )
        for c, child in enumerate(self.children):
            mine = source == c
            if not child.fetches or not mine.any():
                continue
            part = child.spans(
                jax.tree.map(lambda leaf, mine=mine: np.asarray(leaf)[mine], self._plan_of(plan, c))
            )
            k = part.source.shape[1]
            out.source[mine, :k] = self.source_maps[c][part.source]
            out.start[mine, :k] = part.start
            out.length[mine, :k] = part.length
        return out

    def build(self, tables, plan: Plan, content: Content | None) -> Batch:
        """Each row built by its own child (shared calls for equal build signatures).

        ``doc_idx`` (a document within the row's child) is kept only when every child gives one.
        """
        batch = None
        for g, group in enumerate(self.build_groups):
            lead = group[0]
            child = self.children[lead]
            child_plan = plan.detail["groups"][g]
            child_content = None
            if child.fetches and content is not None:
                child_content = Content(content.tokens, content.offsets[:, : child.spans_per_row])
            built = child.build(tables["children"][lead], child_plan, child_content)
            if batch is None:
                batch = built
                continue
            if (built.doc_idx is None) != (batch.doc_idx is None):  # not every child knows documents
                built, batch = (dataclasses.replace(b, doc_idx=None) for b in (built, batch))
            mine = jnp.isin(plan.source, jnp.asarray(group, jnp.int32))
            batch = _select(mine, built, batch)
        return batch

    def real_tokens(self, tables, plan: Plan) -> Int[Array, " n"]:
        """Each row's child's count of real tokens."""
        out = jnp.zeros(plan.source.shape, jnp.int32)
        for c, child in enumerate(self.children):
            tokens = child.real_tokens(tables["children"][c], self._plan_of(plan, c)).astype(jnp.int32)
            out = jnp.where(plan.source == c, tokens, out)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(zip(self.names, self.children, strict=True))})"


def _build_groups(children) -> list[list[int]]:
    """Children sharing a build call: equal, non-None ``build_signature()``."""
    groups: dict[Any, list[int]] = {}
    out = []
    for c, child in enumerate(children):
        signature = getattr(child, "build_signature", lambda: None)()
        if signature is None:
            out.append([c])
        elif signature in groups:
            groups[signature].append(c)
        else:
            groups[signature] = [c]
            out.append(groups[signature])
    return out


def _select(where: Array, new, old):
    """``new`` on rows where ``where``, else ``old``, leaf by leaf (leaves ``[n, ...]``)."""

    def pick(a, b):
        if a is None:
            return None
        mask = where.reshape(where.shape + (1,) * (a.ndim - 1))
        return jnp.where(mask, a, b)

    return jax.tree.map(pick, new, old, is_leaf=lambda x: x is None)
