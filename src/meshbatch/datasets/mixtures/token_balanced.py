"""``TokenBalancedMixture``: the least-consumed interleave (``token-balanced-interleave.md``).

Every row goes to the child that has consumed the fewest real tokens (``real_tokens``: a causal
window counts ``seq_len``, a splice frame its copy length); ties are broken by a keyed hash; the
chosen child's count grows by the row's tokens. A step plans its whole global batch at once: each
child plans its next ``batch`` rows and counts their tokens, and one jitted kernel picks
(``meshbatch.kernels.select_tournament``: a tournament-tree climb a row,
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

import json
import zlib
from collections.abc import Mapping
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray, UInt32

from meshbatch.arguments import check_choice, check_int
from meshbatch.datasets.protocol import Dataset, Plan, Rows
from meshbatch.kernels import Counts, select_tournament
from meshbatch.kernels.internal import named_salts

from .composite import Composite, CompositeDevice

Baseline = Literal["zero", "min", "mean"]


class CountOverflowError(OverflowError):
    """A token-balanced step whose counts (64 bits) or children's epochs (32 bits) would wrap."""


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
        """The least-consumed pick of every row of the step, and the state after it.

        Counts and epochs are not checked here (no host callback in the program, so it can be
        kept in a persistent compilation cache): the host refuses a step whose counts or epochs
        wrapped (``TokenBalancedMixture.check_state``).
        """
        n = rows.position.shape[0]
        if n * self.seq_len >= 2**32 - 1:
            raise ValueError(f"a step of {n} rows of {self.seq_len} tokens: counts would pass 2^32")
        lengths = _u32(self.lengths)
        picked = select_tournament(state.tokens, self._upcoming_tokens(state, n, lengths), self.salts)
        source = picked.source
        position, epoch = _advance(state.position[source], state.epoch[source], picked.nth, lengths[source])
        detail = self.group_plans(source, self.child_plans(source, position, epoch), tokens=picked.tokens)
        position_after, epoch_after = _advance(state.position, state.epoch, picked.taken, lengths)
        after = BalancedState(picked.counts, position_after, epoch_after, state.carried)
        return Plan(rows=rows, source=source, example=position, detail=detail), after

    def _upcoming_tokens(self, state: BalancedState, n: int, lengths) -> Int[Array, "n specs"]:
        """The real tokens of each child's next ``n`` rows, a column per child. A child whose rows
        all count the same (``DeviceDataset.tokens_per_row``) is not planned for them; the others
        plan their next rows, a stack of alike children in one call."""
        ahead = jnp.arange(n, dtype=U32)
        columns = []
        for s, stack in enumerate(self.stacks):
            members = np.asarray(self.members[s])
            fixed = stack.tokens_per_row()
            if fixed is not None:
                columns.append(jnp.full((n, members.size), fixed, jnp.int32))
                continue
            position, epoch = _advance(
                state.position[members][:, None], state.epoch[members][:, None], ahead[None, :],
                lengths[members][:, None],
            )  # fmt: skip
            if members.size == 1:
                plan, _ = stack.plan(Rows(position[0], epoch[0]), None)
                columns.append(stack.real_tokens(plan).astype(jnp.int32)[:, None])
            else:
                columns.append(_upcoming_per_member(stack, Rows(position, epoch)).T)
        order = np.argsort(np.concatenate([np.asarray(m) for m in self.members]))
        return jnp.concatenate(columns, axis=1)[:, order]


@eqx.filter_vmap
def _upcoming_per_member(stack, rows: Rows) -> Int[Array, " n"]:
    """The real tokens of each stacked child's rows (``rows`` ``[members, n]``)."""
    plan, _ = stack.plan(rows, None)
    return stack.real_tokens(plan).astype(jnp.int32)


class TokenBalancedMixture(Composite):
    """The least-consumed interleave of named datasets; see the module docstring.

    Args:
        datasets: ``{spec: Dataset}``, stateless, all with the same ``seq_len``.
        baseline: the consumed-token count a spec new to a checkpoint starts at.
    """

    baseline: Baseline
    num_examples: int
    lengths: list[int]  # each child's rows per epoch

    def __init__(self, datasets: Mapping[str, Dataset], *, baseline: Baseline = "zero"):
        super().__init__(datasets)
        self.baseline = check_choice("baseline", baseline, ("zero", "min", "mean"))
        self.num_examples = 2**32 - 1  # endless: the rows only count how many to pick
        self.lengths = [child.num_examples for child in self.children]

    # -- the dataset protocol -------------------------------------------------------------------

    def make(self, key: PRNGKeyArray) -> tuple[BalancedDevice, Composite]:
        """The children's halves and the tie-break salts (one per spec, from its name)."""
        mixture_key, fields, host = self.make_children(key)
        word = jax.random.bits(mixture_key, (), U32)
        ids = jnp.asarray([zlib.crc32(name.encode()) for name in self.names], U32)
        lengths = tuple(child.num_examples for child in host.children)
        device = BalancedDevice(
            salts=named_salts(word, ids),
            names=tuple(self.names),
            lengths=lengths,
            seq_len=self.seq_len,
            **fields,
        )
        return device, host

    def init_state(self) -> BalancedState:
        zeros = jnp.zeros(len(self.names), U32)
        return BalancedState(Counts(zeros, zeros), zeros, zeros)

    def check_state(self, step: int, before: BalancedState, after: BalancedState) -> None:
        """Refuses a step whose counts passed ``2^64 - 1`` or whose children's epochs passed
        ``2^32 - 1``, naming the specs (``CountOverflowError``).

        A step adds fewer than ``2^32`` tokens and rows per spec (``plan`` refuses more), so a
        count wrapped exactly when its high word went down (``2^32 - 1 -> 0``), and an epoch when
        it went down.
        """
        wrapped = self._went_down(before.tokens.hi, after.tokens.hi)
        if wrapped:
            raise CountOverflowError(
                f"step {step}: the token-balanced count of specs {wrapped} (of {list(self.names)}) "
                "would pass 2^64 - 1 consumed tokens and wrap; refused (reset the counts with "
                "load_state_dict)"
            )
        wrapped = self._went_down(before.epoch, after.epoch)
        if wrapped:
            raise CountOverflowError(
                f"step {step}: a child of the token-balanced mixture of specs {list(self.names)} "
                f"would start its 2^32-th epoch (epochs are 32 bits); refused: {wrapped}"
            )

    def _went_down(self, before, after) -> list[str]:
        """The specs whose per-spec word is lower ``after`` the step than ``before`` it."""
        down = np.asarray(after) < np.asarray(before)
        return [name for name, went in zip(self.names, down, strict=True) if went]

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


def _advance(position, epoch, ahead, length):
    """``(position, epoch)`` of the row ``ahead`` rows after ``(position, epoch)`` of ``length``
    rows (uint32 arrays, broadcast together)."""
    left = length - position  # >= 1: rows before the epoch ends
    beyond = ahead - left
    later = ahead >= left
    return (
        jnp.where(later, beyond % length, position + ahead),
        jnp.where(later, epoch + U32(1) + beyond // length, epoch),
    )
