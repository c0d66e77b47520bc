"""BERT-style masked-LM masking of token rows, one PRNG key per row.

Each position that is not structural (``[DOC]``, ``[EOD]``, pad, or any id in ``special_ids``) is
selected with probability ``rate``; a selected position becomes ``mask_id`` with probability
``mask_fraction``, a random ordinary token with probability ``random_fraction``, and keeps its
token otherwise. ``labels`` hold the original token at selected positions and ``ignore_id``
everywhere else:

    tokens  = [D, 5, 6, 7, E, P]     rate 0.5; positions 1, 3 selected; 1 -> mask, 3 -> keep
    masked  = [D, M, 6, 7, E, P]
    labels  = [I, 5, I, 7, I, I]     (I = ignore_id)

Probabilities are compared as 24-bit integers (a draw of ``bits >> 8`` below
``round(p * 2**24)``), so a rate of 1 selects every eligible position. A random replacement is
uniform over ``[0, vocab_size)`` minus the special ids (a 32-bit draw times the number of ids,
high word: off uniform by at most ``vocab_size / 2**32``). Keys come from the caller, derived from
stream coordinates (``row_keys``) so that a row's mask never depends on which device holds it;
the draws of a row's positions are a counter-based hash of its key (``_position_bits``).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, Key, PRNGKeyArray, UInt32

from ..uint32 import fmix32, mulhi

PROBABILITY_BITS = 24


def threshold(probability: float) -> int:
    """``probability`` as a 24-bit threshold: a draw ``u < threshold`` has that probability."""
    return round(probability * 2**PROBABILITY_BITS)


def row_keys(
    key: PRNGKeyArray, first: UInt32[Array, " n"], second: UInt32[Array, " n"] | None = None
) -> Key[Array, " n"]:
    """One key per row: ``fold_in(key, first)``, then ``fold_in(., second)`` when given."""
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, first)
    if second is not None:
        keys = jax.vmap(jax.random.fold_in)(keys, second)
    return keys


@partial(
    jax.jit,
    static_argnames=(
        "rate",
        "mask_id",
        "vocab_size",
        "special_ids",
        "ignore_id",
        "mask_fraction",
        "random_fraction",
    ),
)
def mlm_mask(
    tokens: Int[Array, "rows seq"],
    keys: Key[Array, " rows"],
    *,
    rate: float,
    mask_id: int,
    vocab_size: int,
    special_ids: tuple[int, ...],
    ignore_id: int,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> tuple[Int[Array, "rows seq"], Int[Array, "rows seq"]]:
    """Masks ``tokens`` (see the module docstring).

    Args:
        tokens: ``int32[rows, seq]``.
        keys: ``[rows]`` typed PRNG keys, one per row.
        rate, mask_id, vocab_size, special_ids, ignore_id, mask_fraction, random_fraction: static
            (module docstring); ``special_ids`` sorted and unique.

    Returns:
        ``(masked tokens, labels)``, both ``int32[rows, seq]``.
    """
    seq = tokens.shape[-1]
    candidates = vocab_size - sum(1 for s in special_ids if 0 <= s < vocab_size)

    def one_row(row, key):
        bits = _position_bits(jax.random.key_data(key), seq)  # select, action, random id
        selected = (bits[0] >> 8) < threshold(rate)
        u = bits[1] >> 8
        random = mulhi(bits[2], jnp.uint32(candidates)).astype(jnp.int32)
        for special in special_ids:  # sorted: shift past each special id, in order
            if 0 <= special < vocab_size:
                random = random + (random >= special).astype(jnp.int32)
        eligible = jnp.ones((seq,), bool)
        for special in special_ids:
            eligible = eligible & (row != special)
        selected = selected & eligible
        replaced = jnp.where(
            u < threshold(mask_fraction),
            jnp.int32(mask_id),
            jnp.where(u < threshold(mask_fraction) + threshold(random_fraction), random, row),
        )
        return jnp.where(selected, replaced, row), jnp.where(selected, row, jnp.int32(ignore_id))

    tokens = tokens.astype(jnp.int32)
    return jax.vmap(one_row)(tokens, keys)


def _position_bits(key_data: UInt32[Array, " 2"], seq: int) -> UInt32[Array, "3 seq"]:
    """Three 32-bit draws per position from a row's key: a counter-based hash (two fmix32 rounds
    keyed by the key's two words) of the draw's (stream, position) counter. Threefry per position
    costs seconds of compilation per program for no statistical gain at these sizes; the row key
    itself still comes from ``fold_in``."""
    counter = jnp.arange(3 * seq, dtype=jnp.uint32).reshape(3, seq)
    return fmix32(fmix32(counter * jnp.uint32(0x9E3779B9) ^ key_data[0]) ^ key_data[1])
