"""Shuffles: keyed bijections of ``[0, length)`` that run inside jitted code.

Each constructor checks its arguments on the host, derives what it can once, and returns an
``equinox.Module``: a pytree whose ``__call__(indices, epoch=None)`` maps uint32 indices to uint32
indices on device. Pass it into ``jax.jit`` like any other pytree; lengths and keys are array
leaves, so a new length or key never forces a recompile.

    >>> shuffle = meshbatch.permutation("feistel", 10, jax.random.key(0))
    >>> jax.jit(lambda s, i: s(i))(shuffle, jnp.arange(10, dtype=jnp.uint32))

``compat="levanter"`` gives Levanter's exact orders (``FeistelPermutation``, ``LcgPermutation``,
``EraShufflingDataset``, marin's ``BlockShufflingDataset``); ``None`` gives the strong default.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from meshbatch.arguments import as_key, check_bool, check_choice, check_int, check_optional_int
from meshbatch.kernels import BlockShuffle, EraShuffle, Permutation
from meshbatch.kernels.internal import Compat, Kind

MAX_LENGTH = 2**32 - 1
Strategy = Literal["none", "full", "era", "block"]


def _u32(value: int) -> jax.Array:
    """A uint32 scalar on the default device: placed, not converted there (a mixture makes one
    per child, and a placement is cheaper than an on-device conversion)."""
    return jax.device_put(np.uint32(value))


def _check_common(length: int, kind: str, compat: str | None) -> int:
    check_choice("kind", kind, Kind)
    check_choice("compat", compat, Compat)
    return check_int("length", length, low=1, high=MAX_LENGTH)


def _keyed_fields(length: int, key: PRNGKeyArray, kind: str, compat: str | None) -> tuple[dict, int]:
    """The checked fields every ``KeyedShuffle`` has, and the checked length as an int."""
    length = _check_common(length, kind, compat)
    return dict(length=_u32(length), key=as_key(key), kind=kind, compat=compat), length


def permutation(kind: Kind, length: int, key: PRNGKeyArray, *, compat: Compat = None) -> Permutation:
    """A keyed permutation of ``[0, length)``.

    Args:
        kind: ``"feistel"`` (cycle-walking Feistel network) or ``"linear"`` (``a x + b mod n``).
        length: the domain size, ``1 <= length <= 2**32 - 1``.
        key: a JAX PRNG key (typed or raw ``uint32[2]``).
        compat: ``"levanter"`` for ``levanter.data._prp.Permutation.make(kind, length, key)``'s
            exact order; ``None`` for the strong default.

    Returns:
        ``perm(indices, epoch=None) -> indices``: uint32 in and out, any shape. With ``epoch``
        the order is that of ``fold_in(key, epoch)`` (epoch 0: the plain key).

    Raises:
        ValueError: for a length outside ``[1, 2**32 - 1]`` or an unknown kind/compat.
        IndexError: when called with concrete indices outside ``[0, length)``.
    """
    length = _check_common(length, kind, compat)
    return Permutation.create(kind, length, as_key(key), compat=compat)


def era_shuffle(
    length: int,
    *,
    era_length: int,
    key: PRNGKeyArray,
    kind: Kind = "feistel",
    compat: Compat = None,
) -> EraShuffle:
    """Shuffle within consecutive eras of ``era_length`` indices (the last era may be shorter).

    Era ``e`` is permuted with ``fold_in(key, e)``, as Levanter's ``EraShufflingDataset``.

    Raises:
        ValueError: for a non-positive ``era_length`` or any ``permutation`` argument error.
    """
    fields, length = _keyed_fields(length, key, kind, compat)
    era_length = min(check_int("era_length", era_length, low=1), length)
    return EraShuffle(**fields, era_length=_u32(era_length))


def block_shuffle(
    length: int,
    *,
    io_block_size: int,
    window_blocks: int,
    key: PRNGKeyArray,
    kind: Kind = "feistel",
    compat: Compat = None,
) -> BlockShuffle:
    """The two-level block shuffle of the block-shuffle specification.

    Whole blocks of ``io_block_size`` consecutive indices are permuted globally, then examples
    are mixed inside windows of ``window_blocks`` blocks; a partial last block stays last and is
    shuffled only within itself. Reads stay block-contiguous while the order is close to a full
    shuffle (see ``benchmarks/bench_permutation_quality.py``).

    Raises:
        ValueError: for non-positive block or window sizes, or a block layout whose padded size
            does not fit 32 bits, or any ``permutation`` argument error.
    """
    fields, length = _keyed_fields(length, key, kind, compat)
    io_block_size = check_int("io_block_size", io_block_size, low=1)
    window_blocks = check_int("window_blocks", window_blocks, low=1)
    total_blocks = -(-length // io_block_size)
    if total_blocks * io_block_size > MAX_LENGTH:
        raise ValueError(
            f"length={length} rounded up to whole blocks of io_block_size={io_block_size} exceeds 2**32 - 1"
        )
    # A window wider than the dataset is the whole dataset; clamping keeps io * window in 32 bits.
    window_blocks = min(window_blocks, total_blocks)
    return BlockShuffle(**fields, io_block_size=_u32(io_block_size), window_blocks=_u32(window_blocks))


@dataclasses.dataclass(frozen=True)
class ShuffleSpec:
    """How a dataset orders its examples within each epoch; checked at construction.

    Attributes:
        strategy: ``"none"`` (source order), ``"full"`` permutation, ``"era"`` or ``"block"``.
        kind: ``"feistel"`` or ``"linear"``.
        compat: ``"levanter"`` for Levanter's exact orders, ``None`` for the strong default.
        era_length: examples per era (``strategy="era"``).
        io_block_size: examples per block (``strategy="block"``); ``None`` lets the dataset
            choose (a causal dataset aligns a block with one read chunk of its cache).
        window_blocks: blocks mixed together (``strategy="block"``).
        reshuffle_each_epoch: epoch ``e >= 1`` uses ``fold_in(key, e)``; otherwise every epoch
            repeats epoch 0's order.
    """

    strategy: Strategy = "full"
    kind: Kind = "feistel"
    compat: Compat = None
    era_length: int | None = None
    io_block_size: int | None = None
    window_blocks: int = 8
    reshuffle_each_epoch: bool = False

    def __post_init__(self):
        check_choice("strategy", self.strategy, Strategy)
        check_choice("kind", self.kind, Kind)
        check_choice("compat", self.compat, Compat)
        check_optional_int("era_length", self.era_length, low=1)
        check_optional_int("io_block_size", self.io_block_size, low=1)
        check_int("window_blocks", self.window_blocks, low=1)
        check_bool("reshuffle_each_epoch", self.reshuffle_each_epoch)
        if self.strategy == "era" and self.era_length is None:
            raise ValueError("strategy='era' needs era_length (got era_length=None)")
        if self.strategy != "era" and self.era_length is not None:
            raise ValueError(f"era_length={self.era_length} only applies to strategy='era'")
        if self.strategy != "block" and (self.io_block_size is not None or self.window_blocks != 8):
            raise ValueError("io_block_size and window_blocks only apply to strategy='block'")
        if self.strategy == "none" and (self.reshuffle_each_epoch or self.kind != "feistel" or self.compat):
            raise ValueError(
                "strategy='none' does not shuffle: kind, compat and reshuffle_each_epoch do not apply"
            )

    def create(self, length: int, key: PRNGKeyArray, *, default_block: int):
        """The shuffle module for ``length`` examples, or ``None`` for ``strategy="none"``.

        ``default_block`` is the block size used when ``io_block_size`` is ``None``.
        """
        common = dict(key=key, kind=self.kind, compat=self.compat)
        if self.strategy == "none":
            return None
        if self.strategy == "full":
            return permutation(self.kind, length, key, compat=self.compat)
        if self.strategy == "era":
            return era_shuffle(length, era_length=self.era_length, **common)
        block = self.io_block_size if self.io_block_size is not None else default_block
        return block_shuffle(length, io_block_size=block, window_blocks=self.window_blocks, **common)

    def apply(self, shuffle, positions, epochs):
        """Examples for ``(position, epoch)`` rows under ``shuffle`` (jittable)."""
        if shuffle is None:
            return positions
        if self.reshuffle_each_epoch:
            return shuffle(positions, epoch=epochs)
        return shuffle(positions)

    def apply_lanes(self, shuffles, positions, epochs):
        """``apply`` with one shuffle per row: ``shuffles``' fields carry a leading row axis
        (alike shuffles stacked and gathered per row); row ``i`` gets what ``apply`` with shuffle
        ``i`` gives it (jittable)."""
        if shuffles is None:
            return positions
        return shuffles.lanes(positions, epochs if self.reshuffle_each_epoch else None)
