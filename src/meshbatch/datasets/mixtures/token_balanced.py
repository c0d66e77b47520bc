"""``TokenBalancedMixture``: the least-consumed interleave (``token-balanced-interleave.md``).

Every row goes to the child that has consumed the fewest real tokens (``real_tokens``: a causal
window counts ``seq_len``, a splice frame its copy length); ties are broken by a keyed hash; the
chosen child's count grows by the row's tokens. A step plans its whole global batch at once: each
child plans its next ``batch`` rows and counts their tokens, and one jitted kernel picks
(``meshbatch.kernels.select_least_consumed``: a tournament-tree climb a row,
``interleave_tree.py``). Every process plans the same global batch from the same state, so the
counts agree everywhere without any reduction between ranks.

The state is part of training state. ``state_dict`` gives the seed's shape::

    {"datasets": [{"spec": "web", "row_offset": 123, "token_offset": 456}, ...],
     "interleave_version": 1}

and ``load_state_dict`` resumes from it exactly: specs it does not configure are kept and written
back unchanged; a spec without ``token_offset`` starts from 0 tokens (the seed's rule); a
configured spec the checkpoint lacks starts at row 0 with the ``baseline`` count: ``"zero"``
(the seed's behaviour: the new spec then takes every row until it catches up), ``"min"`` or
``"mean"`` of the counts of the configured specs the checkpoint holds (the seed's planned fix).
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Mapping
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PRNGKeyArray, UInt32

from meshbatch.arguments import check_choice, check_int
from meshbatch.datasets.protocol import Dataset, Plan, Rows
from meshbatch.kernels import Counts, named_salts, select_least_consumed

from .composite import Composite, CompositeDevice

Baseline = Literal["zero", "min", "mean"]
VERSION = 1
U32 = jnp.uint32


class BalancedState(eqx.Module):
    """The interleave's carried state, per configured spec.

    Attributes:
        tokens: consumed real tokens (exact 64-bit, two words).
        position, epoch: ``uint32[specs]`` the child's next row (``row_offset = epoch * n + position``).
        carried: JSON of the checkpoint's entries for specs not configured here (static).
    """

    tokens: Counts
    position: UInt32[Array, " specs"]
    epoch: UInt32[Array, " specs"]
    carried: tuple[str, ...] = eqx.field(static=True, default=())


class BalancedDevice(CompositeDevice):
    """The device half of ``TokenBalancedMixture``: the children, the tie-break salts (one per
    spec, from its name and the mixture's key), each child's rows per epoch and ``seq_len``."""

    salts: UInt32[Array, " specs"]
    names: tuple[str, ...] = eqx.field(static=True)
    lengths: tuple[int, ...] = eqx.field(static=True)
    seq_len: int = eqx.field(static=True)

    def plan(self, rows: Rows, state: BalancedState) -> tuple[Plan, BalancedState]:
        """The least-consumed pick of every row of the step, and the state after it."""
        n = rows.position.shape[0]
        if n * self.seq_len >= 2**32 - 1:
            raise ValueError(f"a step of {n} rows of {self.seq_len} tokens: counts would pass 2^32")
        ahead = jnp.arange(n, dtype=U32)
        upcoming, table = [], []
        for c, child in enumerate(self.children):
            position, epoch = _advance(state.position[c], state.epoch[c], ahead, self.lengths[c])
            plan, _ = child.plan(Rows(position, epoch), None)
            upcoming.append(plan)
            table.append(child.real_tokens(plan).astype(jnp.int32))
        picked = select_least_consumed(state.tokens, jnp.stack(table, axis=1), self.salts)
        picked = dataclasses.replace(picked, counts=self._refuse_wrap(state.tokens, picked.counts))
        plans = tuple(
            jax.tree.map(lambda leaf, c=c: leaf[jnp.where(picked.source == c, picked.nth, U32(0))], plan)
            for c, plan in enumerate(upcoming)
        )
        example = jnp.zeros(n, U32)
        for c, plan in enumerate(plans):
            example = jnp.where(picked.source == c, plan.rows.position, example)
        position, epoch = zip(
            *(
                _advance(state.position[c], state.epoch[c], picked.taken[c], self.lengths[c])
                for c in range(len(self.children))
            ),
            strict=True,
        )
        after = BalancedState(
            picked.counts,
            jnp.stack(position),
            self._refuse_epoch_wrap(state.epoch, jnp.stack(epoch)),
            state.carried,
        )
        detail = self.group_plans(picked.source, plans, tokens=picked.tokens)
        return Plan(rows=rows, source=picked.source, example=example, detail=detail), after

    def _refuse_wrap(self, before: Counts, after: Counts) -> Counts:
        """``after``, or an error when a count passed ``2^64 - 1`` and wrapped.

        A step adds fewer than ``2^32`` tokens per spec (``plan`` refuses more), so a count wrapped
        exactly when its high word went down: ``hi = 2^32 - 1 -> 0``. The check runs on device
        (``equinox.error_if``) and raises at the step that would wrap, naming the specs.
        """
        wrapped = jnp.any(after.hi < before.hi)
        message = (
            f"a token-balanced count of specs {list(self.names)} would pass 2^64 - 1 consumed tokens "
            "and wrap; refused (reset the counts with load_state_dict)"
        )
        return Counts(eqx.error_if(after.hi, wrapped, message), after.lo)

    def _refuse_epoch_wrap(self, before: UInt32[Array, " specs"], after: UInt32[Array, " specs"]):
        """``after``, or an error when a child's epoch passed ``2^32 - 1`` and wrapped (a child of
        ``L`` rows gets there after ``2^32 * L`` of its rows: a one-row child after 2^32).

        A step adds fewer than ``2^32`` rows, so an epoch wrapped exactly when it went down.
        """
        message = (
            f"a child of the token-balanced mixture of specs {list(self.names)} would start its "
            "2^32-th epoch (epochs are 32 bits); refused"
        )
        return eqx.error_if(after, jnp.any(after < before), message)


class TokenBalancedMixture(Composite):
    """The least-consumed interleave of named datasets; see the module docstring.

    Args:
        datasets: ``{spec: Dataset}``, stateless, all with the same ``seq_len``.
        baseline: the consumed-token count a spec new to a checkpoint starts at.
    """

    def __init__(self, datasets: Mapping[str, Dataset], *, baseline: Baseline = "zero"):
        super().__init__(datasets)
        self.baseline = check_choice("baseline", baseline, ("zero", "min", "mean"))
        self.num_examples = 2**32 - 1  # endless: the rows only count how many to pick
        self.lengths = [child.num_examples for child in self.children]

    # -- the dataset protocol -------------------------------------------------------------------

    def make(self, key: PRNGKeyArray) -> tuple[BalancedDevice, Composite]:
        """The children's halves and the tie-break salts (one per spec, from its name)."""
        mixture_key, child_keys = self.derive_keys(key)
        word = jax.random.bits(mixture_key, (), U32)
        ids = jnp.asarray([zlib.crc32(name.encode()) for name in self.names], U32)
        fields, host = self.make_children(child_keys)
        lengths = tuple(child.num_examples for child in host.children)
        device = BalancedDevice(
            salts=named_salts(word, ids),
            names=tuple(self.names),
            lengths=lengths,
            seq_len=self.seq_len,
            **fields,
        )
        return device, host

    def device(self, key: PRNGKeyArray) -> BalancedDevice:
        return self.make(key)[0]

    def init_state(self) -> BalancedState:
        zeros = jnp.zeros(len(self.names), U32)
        return BalancedState(Counts(zeros, zeros), zeros, zeros)

    # -- checkpoints ----------------------------------------------------------------------------

    def state_dict(self, state: BalancedState) -> dict[str, Any]:
        """The seed's ``{"datasets": [...]}`` (configured specs, then the carried ones) + version."""
        arrays = (state.tokens.hi, state.tokens.lo, state.position, state.epoch)
        hi, lo, position, epoch = (np.asarray(x).astype(np.int64) for x in arrays)
        entries = [
            {
                "spec": name,
                "row_offset": int(epoch[c]) * self.lengths[c] + int(position[c]),
                "token_offset": (int(hi[c]) << 32) + int(lo[c]),
            }
            for c, name in enumerate(self.names)
        ]
        return {"datasets": entries + [json.loads(x) for x in state.carried], "interleave_version": VERSION}

    def load_state_dict(self, state_dict: dict[str, Any]) -> BalancedState:
        """The state a ``state_dict`` (or the seed's ``resume_state``) describes.

        Raises:
            TypeError, ValueError: a malformed checkpoint, naming the entry and field.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a dict (got {state_dict!r})")
        extra = sorted(set(state_dict) - {"datasets", "interleave_version"})
        if extra:
            raise ValueError(f"unknown keys {extra} in a token-balanced state_dict")
        version = state_dict.get("interleave_version", VERSION)  # the seed's checkpoints have none
        if version != VERSION:
            raise ValueError(f"interleave_version={version!r} is not {VERSION}")
        entries = state_dict.get("datasets")
        if not isinstance(entries, list):
            raise ValueError(f"state_dict['datasets'] must be a list (got {entries!r})")
        found, carried = {}, []
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("spec"), str):
                raise ValueError(
                    f"state_dict['datasets'][{i}] must be a dict with a string 'spec' (got {entry!r})"
                )
            spec = entry["spec"]
            if spec in found or any(json.loads(x)["spec"] == spec for x in carried):
                raise ValueError(f"spec {spec!r} appears twice in state_dict['datasets']")
            if spec not in self.names:
                carried.append(json.dumps(dict(entry)))  # key order kept: written back as read
                continue
            rows = check_int(f"row_offset of {spec!r}", entry.get("row_offset"), low=0)
            tokens = check_int(
                f"token_offset of {spec!r}", entry.get("token_offset", 0), low=0, high=2**64 - 1
            )
            found[spec] = (rows, tokens)
        known = [tokens for _, tokens in found.values()]
        start = {"zero": 0, "min": min(known, default=0), "mean": sum(known) // max(len(known), 1)}[
            self.baseline
        ]
        position, epoch, tokens = [], [], []
        for c, name in enumerate(self.names):
            rows, count = found.get(name, (0, start))
            wraps, offset = divmod(rows, self.lengths[c])
            if wraps > 2**32 - 1:
                raise ValueError(f"row_offset={rows} of {name!r} wraps its {self.lengths[c]} rows 2^32 times")
            position.append(offset)
            epoch.append(wraps)
            tokens.append(count)
        return BalancedState(
            Counts(_u32([t >> 32 for t in tokens]), _u32([t & 0xFFFFFFFF for t in tokens])),
            _u32(position),
            _u32(epoch),
            tuple(carried),
        )

    def __repr__(self) -> str:
        children = dict(zip(self.names, self.children, strict=True))
        return f"TokenBalancedMixture({children}, baseline={self.baseline!r})"


def _u32(values) -> jax.Array:
    return jnp.asarray(np.asarray(values, np.int64), U32)


def _advance(position, epoch, ahead, length: int):
    """``(position, epoch)`` of the row ``ahead`` rows after ``(position, epoch)`` of ``length``."""
    length = U32(length)
    left = length - position  # >= 1: rows before the epoch ends
    beyond = ahead - left
    later = ahead >= left
    return (
        jnp.where(later, beyond % length, position + ahead),
        jnp.where(later, epoch + U32(1) + beyond // length, epoch),
    )
