"""Masked-LM masking as a pipeline build stage: BERT's 80/10/10, on device, per shard.

    stage = MLMMasking(key, mask_id=260, vocab_size=257, special_ids=(257, 258, 259), mode="static")
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=64, key=key, stages=(stage,))

``mode="dynamic"`` draws a fresh mask every time a row is read: row ``g`` of the stream (position
``p`` of epoch ``e``) uses ``fold_in(fold_in(key, p), e)``. ``mode="static"`` fixes one mask per
example: ``fold_in(key, example)`` (the block id), the same in every epoch and wherever it lands.
Neither depends on the shard or device a row is built on. The stage replaces ``tokens``, sets
``labels`` (the original token where masked, ``ignore_id`` elsewhere) and sets ``loss_mask`` to 1
exactly at the masked positions.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from meshbatch.arguments import as_key, check_bool, check_choice, check_float, check_int, check_token_id
from meshbatch.kernels import Batch, mlm_mask
from meshbatch.kernels.internal import row_keys

MODES = ("dynamic", "static")


class MLMMasking(eqx.Module):
    """A ``BuildStage``: BERT-style masking of a batch (see the module docstring).

    Args:
        key: the masking key (an int seed or a JAX key); independent of the data key.
        mask_id: the mask token: non-negative, not one of ``special_ids`` (markers, pad) and outside
            the vocabulary ``[0, vocab_size)``, so a masked position never reads as a real token.
        vocab_size: random replacements come from ``[0, vocab_size)`` minus ``special_ids``.
        special_ids: ids never masked or drawn (``[DOC]``, ``[EOD]``, pad, ...).
        rate: the share of eligible positions selected, in ``(0, 1]``.
        mode: ``"dynamic"`` or ``"static"``.
        ignore_id: the label of unselected positions.
        mask_fraction, random_fraction: of the selected positions, those replaced by ``mask_id``
            and by a random token (the rest keep theirs); ``0.8`` and ``0.1`` by default.
        mask_in_vocab: the documented exception: ``mask_id`` is the tokenizer's own mask token
            inside the vocabulary (BERT's ``[MASK]`` = 103 of 30522). It is then never drawn as a
            random replacement and a position already holding it is never selected. Refused when
            ``mask_id`` is outside the vocabulary (the exception would not apply).

    Raises:
        ValueError: ``mask_id`` negative, a special id, or inside the vocabulary without
            ``mask_in_vocab=True`` (named), or any other bad argument.
    """

    key: PRNGKeyArray
    mask_id: int = eqx.field(static=True)
    vocab_size: int = eqx.field(static=True)
    special_ids: tuple[int, ...] = eqx.field(static=True)
    rate: float = eqx.field(static=True)
    mode: str = eqx.field(static=True)
    ignore_id: int = eqx.field(static=True)
    mask_fraction: float = eqx.field(static=True)
    random_fraction: float = eqx.field(static=True)
    mask_in_vocab: bool = eqx.field(static=True)

    def __init__(
        self,
        key,
        *,
        mask_id: int,
        vocab_size: int,
        special_ids=(),
        rate: float = 0.15,
        mode: str = "dynamic",
        ignore_id: int = -100,
        mask_fraction: float = 0.8,
        random_fraction: float = 0.1,
        mask_in_vocab: bool = False,
    ):
        self.key = as_key(key)
        self.mask_id = check_int("mask_id", mask_id, low=0, high=2**31 - 1)
        self.vocab_size = check_int("vocab_size", vocab_size, low=1, high=2**31 - 1)
        if not isinstance(special_ids, list | tuple):
            raise TypeError(f"special_ids must be a list or tuple of ids (got special_ids={special_ids!r})")
        self.special_ids = tuple(sorted({check_token_id("special_ids", s) for s in special_ids}))
        self.mask_in_vocab = check_bool("mask_in_vocab", mask_in_vocab)
        _check_mask_id(self.mask_id, self.vocab_size, self.special_ids, self.mask_in_vocab)
        self.rate = check_float("rate", rate, low=0.0, high=1.0)
        if self.rate == 0.0:
            raise ValueError(f"rate must be > 0 (got {rate=}); leave the stage out to mask nothing")
        self.mode = check_choice("mode", mode, MODES)
        self.ignore_id = check_token_id("ignore_id", ignore_id)
        if 0 <= self.ignore_id < self.vocab_size or self.ignore_id in (self.mask_id, *self.special_ids):
            raise ValueError(
                f"ignore_id={ignore_id} must not be a token id (vocab_size={vocab_size}, specials)"
            )
        self.mask_fraction = check_float("mask_fraction", mask_fraction, low=0.0, high=1.0)
        self.random_fraction = check_float("random_fraction", random_fraction, low=0.0, high=1.0)
        if mask_fraction + random_fraction > 1.0:
            raise ValueError(
                f"mask_fraction + random_fraction must be <= 1 (got {mask_fraction=}, {random_fraction=})"
            )
        excluded = {*self.special_ids, *((self.mask_id,) if mask_in_vocab else ())}
        if self.vocab_size <= sum(1 for s in excluded if 0 <= s < self.vocab_size):
            raise ValueError(f"no ordinary token to draw: every id below {vocab_size=} is special")

    def __call__(self, batch: Batch, plan) -> Batch:
        """Masks ``batch``; ``plan`` is the rows' plan (``meshbatch.datasets.protocol.Plan``)."""
        if self.mode == "dynamic":
            keys = row_keys(self.key, plan.rows.position, plan.rows.epoch)
        else:
            keys = row_keys(self.key, plan.example)
        tokens, labels = mlm_mask(
            batch.tokens,
            keys,
            rate=self.rate,
            mask_id=self.mask_id,
            vocab_size=self.vocab_size,
            special_ids=self._excluded(),
            ignore_id=self.ignore_id,
            mask_fraction=self.mask_fraction,
            random_fraction=self.random_fraction,
        )
        loss_mask = (labels != self.ignore_id).astype(jnp.int32)
        return dataclasses.replace(batch, tokens=tokens, labels=labels, loss_mask=loss_mask)

    def _excluded(self) -> tuple[int, ...]:
        """Ids never selected nor drawn: the specials, and an in-vocabulary mask token."""
        return tuple(sorted({*self.special_ids, self.mask_id})) if self.mask_in_vocab else self.special_ids


def _check_mask_id(mask_id: int, vocab_size: int, special_ids: tuple[int, ...], mask_in_vocab: bool) -> None:
    """Refuses a mask id that would read as a marker, as padding or as an ordinary token::

    mask_id=257 with special_ids (257, 258, 259)    -> a structural or pad id
    mask_id=65 with vocab_size=257                  -> an ordinary token (unless mask_in_vocab)
    """
    if mask_id in special_ids:
        raise ValueError(
            f"mask_id={mask_id} is one of special_ids={special_ids} (a structural or pad id): a masked "
            "position would read as a marker or padding"
        )
    if mask_id < vocab_size and not mask_in_vocab:
        raise ValueError(
            f"mask_id={mask_id} is an ordinary token of the vocabulary [0, {vocab_size}): use an id >= "
            f"vocab_size, or pass mask_in_vocab=True when it is the tokenizer's own mask token"
        )
    if mask_in_vocab and mask_id >= vocab_size:
        raise ValueError(
            f"mask_in_vocab=True but mask_id={mask_id} is outside the vocabulary [0, {vocab_size}); "
            "leave mask_in_vocab False"
        )
