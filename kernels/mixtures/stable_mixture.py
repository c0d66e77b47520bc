"""Stable mixtures: a closed-form map from a global row to ``(source, index within source)``.

Rows are cut into blocks of ``block_size``. Every block of a stage holds exactly ``counts[s]``
rows of each source ``s`` (the counts sum to ``block_size``): in-block ids ``0 .. block_size-1``
are laid out source after source (``first[s]`` is source ``s``'s first id), and a keyed
permutation of the block, one per block, decides which row gets which id. Id ``first[s] + r`` is
source ``s``'s ``r``-th row of the block, i.e. its read number
``reads_before_stage[s] + (block - stage_start) * counts[s] + r``; that number modulo the source's
length is the index, its quotient the source's epoch (its wrap count).

    counts = [2, 1], block_size = 3, lengths = [5, 2], block 1, permutation (1, 2, 0):
    ids in order      [a0 a1 b0]      ->  block 1 rows hold ids [a1, b0, a0]
    reads             a: 2 + [1, 0] = [3, 2];  b: 1 + 0 = 1
    (source, index)   rows 3, 4, 5 -> (0, 3), (1, 1), (0, 2)      (reads of b wrap past 2)

``compat="levanter"`` permutes a block exactly as Levanter's ``MixtureDataset`` does:
``jax.random.permutation(fold_in(key, block), ids)`` (a sort with random keys over the whole
block; computed once per distinct block a call touches). The default permutes each block with the
strong Feistel network of ``meshbatch.kernels.shuffles.feistel`` (cycle walking), O(1) per row, its
round keys a keyed murmur3 hash of ``(block, round)`` (no key derivation per block).

Everything is uint32: a read number can exceed 2^32 over a long run, so it is never formed; its
quotient and remainder by the length come from ``muldiv``'s 64-bit long division. The quotient,
a source's epoch, is 32 bits: a row whose source would start its 2^32-th pass is refused (source
``WRAPPED``), never given a wrong index.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int, Integer, PRNGKeyArray, UInt32

from ..shuffles.feistel import STRONG_ROUNDS, StrongNetwork, strong_halves
from ..shuffles.permutation import INVALID, apply_network, check_indices
from ..uint32 import fmix32, mul_wide, muldiv

U32 = jnp.uint32
WRAPPED = -2  # the source of a row whose source would pass 2^32 - 1 epochs (32-bit epochs)
Compat = Literal["levanter"] | None


class MixtureSchedule(eqx.Module):
    """A stable mixture's row map; build it with ``meshbatch.mixture_schedule``.

    Attributes:
        key: typed key of the in-block permutations.
        lengths: ``uint32[sources]`` rows of each source.
        stage_start: ``uint32[stages]`` first block of each stage (``stage_start[0] = 0``).

        The tables may be padded (more sources and stages than the mixture has): a padding
        source has ``counts = 0`` and ``first = block_size``, a padding stage starts at block
        ``2^32 - 1``, so neither is ever selected.
        counts: ``uint32[stages, sources]`` rows of each source per block of a stage.
        first: ``uint32[stages, sources]`` first in-block id of each source (exclusive cumsum).
        base_wrap, base_index: ``uint32[stages, sources]`` ``divmod(reads before the stage,
            length)``.
        passes: ``uint32[sources]`` wraps of each source in one pass of a finite mixture (1 for
            restart); a replayed pass ``e`` starts the source's epochs at ``e * passes``.
        num_rows: ``uint32`` rows of one pass: the mixture's length when finite; under restart
            the whole blocks below 2^32 (the pass only serves to split huge row numbers).
        block_size: ``uint32`` rows per block.
        sort_size: ``block_size`` as a static int for Levanter's sort-based permutation (its
            shape); ``None`` otherwise, so the default compiles once for every block size.
        compat: ``"levanter"`` or ``None`` (static).
        finite: whether rows past ``num_rows`` are out of range (static).
    """

    key: PRNGKeyArray
    lengths: UInt32[Array, " sources"]
    stage_start: UInt32[Array, " stages"]
    counts: UInt32[Array, "stages sources"]
    first: UInt32[Array, "stages sources"]
    base_wrap: UInt32[Array, "stages sources"]
    base_index: UInt32[Array, "stages sources"]
    passes: UInt32[Array, " sources"]
    num_rows: UInt32[Array, ""]
    block_size: UInt32[Array, ""]
    sort_size: int | None = eqx.field(static=True)
    compat: Compat = eqx.field(static=True)
    finite: bool = eqx.field(static=True)

    @property
    def num_sources(self) -> int:
        return self.lengths.shape[0]

    def lookup(
        self,
        rows: Integer[Array | np.ndarray, " n"],
        epoch: Integer[Array | np.ndarray, ""] | Integer[Array | np.ndarray, " n"] | int | np.integer = 0,
    ) -> tuple[Int[Array, " n"], UInt32[Array, " n"]]:
        """``(source int32[n], index uint32[n])`` of each row (jitted); see ``locate``. Host
        callers pass numpy rows on purpose (range-checked when finite, then made ``uint32``)."""
        source, index, _ = self.locate(rows, epoch)
        return source, index

    def locate(
        self,
        rows: Integer[Array | np.ndarray, " n"],
        epoch: Integer[Array | np.ndarray, ""] | Integer[Array | np.ndarray, " n"] | int | np.integer = 0,
    ) -> tuple[Int[Array, " n"], UInt32[Array, " n"], UInt32[Array, " n"]]:
        """``(source, index, source_epoch)`` of each row of pass ``epoch`` (jitted).

        Under restart, pass ``e`` row ``r`` is global row ``e * num_rows + r``; a finite mixture
        replays the same ``(source, index)`` each pass, with the sources' epochs moved on.
        Rows out of range (``r >= num_rows``, or more than 2^32 blocks) give source ``-1`` and
        ``INVALID`` index and epoch; concrete rows out of range raise ``IndexError``. A row whose
        source would start its 2^32-th pass (a source's epoch is 32 bits: a one-row source gets
        there after 2^32 of its reads) gives source ``WRAPPED`` (-2), ``INVALID`` index and epoch.
        """
        if self.finite and not isinstance(self.num_rows, jax.core.Tracer):
            check_indices(rows, int(self.num_rows))
        return _locate(self, jnp.asarray(rows).astype(U32), jnp.asarray(epoch).astype(U32))


def _levanter_ids(key, block, position, block_size: int):
    """``jax.random.permutation(fold_in(key, b), block_size)[position]`` for each row's block ``b``.

    The permutation is a sort of the whole block, so each distinct block is permuted once: the
    distinct blocks of the call are taken ``slots`` at a time (``slots`` covers any run of
    consecutive rows in one round) and their permutations gathered into the rows.
    """
    n = block.shape[0]
    if n == 0:
        return jnp.zeros(0, U32)
    slots = min(n, n // block_size + 2)
    distinct = jnp.unique(block, size=n, fill_value=jnp.max(block))
    slot = jnp.searchsorted(distinct, block, side="left").astype(jnp.int32)
    rounds = (jnp.max(slot) // slots) + 1

    def permute(b):
        return jax.random.permutation(jax.random.fold_in(key, b), block_size).astype(U32)

    def body(carry):
        r, out = carry
        chunk = jax.lax.dynamic_slice(jnp.pad(distinct, (0, slots)), (r * slots,), (slots,))
        table = jax.vmap(permute)(chunk)
        here = (slot >= r * slots) & (slot < (r + 1) * slots)
        local = jnp.clip(slot - r * slots, 0, slots - 1)
        return r + 1, jnp.where(here, table[local, position.astype(jnp.int32)], out)

    out = jnp.zeros(n, U32)
    return jax.lax.while_loop(lambda c: c[0] < rounds, body, (jnp.int32(0), out))[1]


def _last_at_most(
    first: UInt32[Array, "stages sources"], stage: Int[Array, " n"], q: UInt32[Array, " n"]
) -> Int[Array, " n"]:
    """Per row, the last source ``s`` with ``first[stage, s] <= q`` (``first`` is nondecreasing
    along sources; ``first[stage, 0] = 0 <= q``): a binary search, ``log2(sources)`` gathers a
    row instead of a ``[rows, sources]`` compare and ``[rows, sources]`` table copies.

        first[stage] = [0, 2, 2, 3, 4, 4] (source 1 has no rows), q = 2  ->  source 2
    """
    sources = first.shape[1]
    low = jnp.zeros(q.shape, jnp.int32)  # sources before low are <= q; from high on, > q
    high = jnp.full(q.shape, sources, jnp.int32)

    def halve(_, bounds):
        low, high = bounds
        mid = (low + high) // 2
        at_most = first[stage, jnp.minimum(mid, sources - 1)] <= q
        return jnp.where(at_most & (mid < high), mid + 1, low), jnp.where(at_most, high, mid)

    # a loop, not unrolled: the program is the same size for any number of sources
    low, _ = jax.lax.fori_loop(0, sources.bit_length(), halve, (low, high))
    return low - 1


def _divmod_reads(k, count, rank, length):
    """``divmod(k * count + rank, length)`` exactly (``k * count`` may pass 2^32), and whether
    the quotient fits 32 bits (it does not when the 64-bit numerator's high word reaches
    ``length``: a source of few rows wraps 2^32 times long before 2^32 blocks)."""
    low, high = mul_wide(k, count)
    fits = high + (low + rank < low).astype(U32) < length
    quotient = muldiv(k, count, rank, length)
    remainder = k * count + rank - quotient * length  # exact mod 2^32, and < length
    return quotient, remainder, fits


def _add_fits(
    a: UInt32[Array, " n"], b: UInt32[Array, " n"]
) -> tuple[UInt32[Array, " n"], Bool[Array, " n"]]:
    """``a + b`` and whether it stayed below 2^32."""
    total = a + b
    return total, total >= a


def mixture_locate(
    schedule: MixtureSchedule, rows: UInt32[Array, " n"], epoch: UInt32[Array, ""] | UInt32[Array, " n"]
):
    """``MixtureSchedule.locate`` unjitted, for plan kernels."""
    size = schedule.block_size
    rows = rows.reshape(-1)
    per_pass = schedule.num_rows // size  # blocks of a pass (restart: whole blocks)
    if schedule.finite:
        block, valid = rows // size, rows < schedule.num_rows
        replay = epoch
    else:
        # Global block epoch * per_pass + rows // size, refused where it passes 2^32 - 1.
        low = rows // size
        fits = (epoch == 0) | (epoch <= (U32(0xFFFFFFFF) - low) // jnp.maximum(per_pass, U32(1)))
        block, replay = epoch * per_pass + low, U32(0)
        valid = fits & (block < U32(0xFFFFFFFF))  # block 2^32 - 1 is where padding stages start
    position = rows - (rows // size) * size
    block = jnp.where(valid, block, U32(0))
    stage = (jnp.sum(block[:, None] >= schedule.stage_start[None, :], axis=1) - 1).astype(jnp.int32)
    # q: the in-block id at ``position`` of ``block``, the block's keyed permutation
    if schedule.compat == "levanter":
        q = _levanter_ids(schedule.key, block, position, schedule.sort_size)
    else:  # round keys of block b: a keyed hash of (b, round); one network per row, no table
        words = jax.random.key_data(schedule.key).astype(U32)
        rounds = jnp.arange(STRONG_ROUNDS, dtype=U32)
        keys = fmix32((fmix32(block ^ words[0])[:, None] + rounds[None, :] * U32(0x9E3779B9)) ^ words[1])
        a, b = strong_halves(size)
        network = StrongNetwork(keys, jnp.broadcast_to(a, block.shape), jnp.broadcast_to(b, block.shape))
        q = apply_network("feistel", network, position, size, batched=True)
    source = _last_at_most(schedule.first, stage, q)

    def pick(table):
        return table[stage, source]

    rank = q - pick(schedule.first)
    length = schedule.lengths[source]
    k = block - schedule.stage_start[stage]
    wrap, index, fits = _divmod_reads(k, pick(schedule.counts), rank, length)
    # Add the stage's base (wrap, index); index + base_index may pass length once.
    base_index = pick(schedule.base_index)
    over = index >= length - base_index
    index = jnp.where(over, index - (length - base_index), index + base_index)
    replays, replays_high = mul_wide(replay, schedule.passes[source])
    wrap, fits_base = _add_fits(wrap, pick(schedule.base_wrap))
    wrap, fits_over = _add_fits(wrap, over.astype(U32))
    wrap, fits_replay = _add_fits(wrap, replays)
    # a source's epoch is 32 bits: a row whose source would start its 2^32-th pass is refused
    wrapped = valid & ~(fits & fits_base & fits_over & fits_replay & (replays_high == 0))
    valid = valid & ~wrapped
    invalid = U32(INVALID)
    return (
        jnp.where(wrapped, WRAPPED, jnp.where(valid, source, -1)),
        jnp.where(valid, index, invalid),
        jnp.where(valid, wrap, invalid),
    )


_locate = jax.jit(mixture_locate)
