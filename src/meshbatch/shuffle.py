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

import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from meshbatch.kernels.permutation import COMPATS, KINDS, Compat, Kind, Permutation, typed_key
from meshbatch.kernels.shuffles import BlockShuffle, EraShuffle

MAX_LENGTH = 2**32 - 1


def _check_common(length: int, kind: str, compat: str | None) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} (got kind={kind!r})")
    if compat not in COMPATS:
        raise ValueError(f"compat must be one of {COMPATS} (got compat={compat!r})")
    _check_positive("length", length)
    if length > MAX_LENGTH:
        raise ValueError(f"length must be <= 2**32 - 1 (got length={length})")


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | jnp.integer):
        raise TypeError(f"{name} must be an int (got {name}={value!r})")
    if value <= 0:
        raise ValueError(f"{name} must be positive (got {name}={value})")


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
    _check_common(length, kind, compat)
    return Permutation.create(kind, int(length), key, compat=compat)


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
    _check_common(length, kind, compat)
    _check_positive("era_length", era_length)
    era_length = min(int(era_length), int(length))
    return EraShuffle(
        length=jnp.asarray(length, jnp.uint32),
        key=typed_key(key),
        kind=kind,
        compat=compat,
        era_length=jnp.asarray(era_length, jnp.uint32),
    )


def block_shuffle(
    length: int,
    *,
    io_block_size: int,
    window_blocks: int,
    key: PRNGKeyArray,
    kind: Kind = "feistel",
    compat: Compat = None,
) -> BlockShuffle:
    """The two-level block shuffle of ``blockwise-shuffle-plan.md``.

    Whole blocks of ``io_block_size`` consecutive indices are permuted globally, then examples
    are mixed inside windows of ``window_blocks`` blocks; a partial last block stays last and is
    shuffled only within itself. Reads stay block-contiguous while the order is close to a full
    shuffle (see ``benchmarks/bench_permutation_quality.py``).

    Raises:
        ValueError: for non-positive block or window sizes, or a block layout whose padded size
            does not fit 32 bits, or any ``permutation`` argument error.
    """
    _check_common(length, kind, compat)
    _check_positive("io_block_size", io_block_size)
    _check_positive("window_blocks", window_blocks)
    total_blocks = -(-int(length) // int(io_block_size))
    if total_blocks * int(io_block_size) > MAX_LENGTH:
        raise ValueError(
            f"length={length} rounded up to whole blocks of io_block_size={io_block_size} exceeds 2**32 - 1"
        )
    # A window wider than the dataset is the whole dataset; clamping keeps io * window in 32 bits.
    window_blocks = min(int(window_blocks), total_blocks)
    return BlockShuffle(
        length=jnp.asarray(length, jnp.uint32),
        key=typed_key(key),
        kind=kind,
        compat=compat,
        io_block_size=jnp.asarray(io_block_size, jnp.uint32),
        window_blocks=jnp.asarray(window_blocks, jnp.uint32),
    )
