"""numpy's ``PCG64`` key schedule, on device, in 32-bit arithmetic.

Levanter derives every permutation's parameters on the host:
``seed = jax.random.randint(key, (), 0, 2**30)``, then
``numpy.random.Generator(numpy.random.PCG64(seed)).integers(...)``. Reproducing that chain inside
the kernel lets Levanter-compatible era and block shuffles derive a fresh key schedule per era or
window without a host round trip, bit for bit, and without ``jax_enable_x64``:

    seed (uint32) --SeedSequence--> 4 x uint64 --pcg64 srandom--> 128-bit state
    draw d (uint32) = low half of output d//2 + 1 if d is even, else its high half
    integers(0, 2**rb) = draw >> (32 - rb)          (Lemire; a power of two never rejects)

128-bit values are eight 16-bit limbs held in uint32 lanes (little-endian), so every product of
two limbs fits 32 bits. All functions are elementwise over arrays of any shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray, UInt32

from ..uint32 import mul_wide

U32 = jnp.uint32
_MASK16 = 0xFFFF

# numpy.random.SeedSequence constants (bit_generator.pyx).
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_POOL_SIZE = 4

# PCG_DEFAULT_MULTIPLIER_128, as eight 16-bit limbs, little-endian.
_PCG_MULT = (2549297995355413924 << 64) | 4865540595714422341
_PCG_MULT_LIMBS = tuple((_PCG_MULT >> (16 * i)) & _MASK16 for i in range(8))

Limbs = tuple[UInt32[Array, "..."], ...]


def levanter_seed(key: PRNGKeyArray) -> UInt32[Array, ""]:
    """The numpy seed Levanter derives from a JAX key: ``randint(key, (), 0, 2**30)``."""
    return jax.random.randint(key, (), 0, 2**30).astype(U32)


def _seed_sequence_words(seed: UInt32[Array, "..."]) -> list[UInt32[Array, "..."]]:
    """``SeedSequence(seed).generate_state(4, uint64)`` as eight uint32 words, little-endian."""
    hash_const = [U32(_INIT_A)]

    def hashmix(value):
        value = value ^ hash_const[0]
        hash_const[0] = hash_const[0] * U32(_MULT_A)
        value = value * hash_const[0]
        return value ^ (value >> 16)

    def mix(x, y):
        result = U32(_MIX_MULT_L) * x - U32(_MIX_MULT_R) * y
        return result ^ (result >> 16)

    zero = jnp.zeros_like(seed)
    pool = [hashmix(seed if i == 0 else zero) for i in range(_POOL_SIZE)]
    for i_src in range(_POOL_SIZE):
        for i_dst in range(_POOL_SIZE):
            if i_src != i_dst:
                pool[i_dst] = mix(pool[i_dst], hashmix(pool[i_src]))

    words = []
    hash_b = U32(_INIT_B)
    for i in range(2 * _POOL_SIZE):
        value = pool[i % _POOL_SIZE] ^ hash_b
        hash_b = hash_b * U32(_MULT_B)
        value = value * hash_b
        words.append(value ^ (value >> 16))
    return words


def _limbs_from_words(hi64: tuple, lo64: tuple) -> Limbs:
    """A 128-bit value ``(hi64 << 64) | lo64`` from two (low word, high word) uint64 pairs."""
    out = []
    for word in (*lo64, *hi64):
        out += [word & U32(_MASK16), word >> 16]
    return tuple(out)


def _carry(columns: list) -> Limbs:
    """Propagate carries through column sums; drops the carry out of the top limb (mod 2^128)."""
    out, carry = [], U32(0)
    for column in columns:
        total = column + carry
        out.append(total & U32(_MASK16))
        carry = total >> 16
    return tuple(out)


def _mul_const(a: Limbs, const_limbs: tuple[int, ...]) -> Limbs:
    """``a * const mod 2^128``; column sums stay below 2^21 so uint32 never overflows."""
    columns = [jnp.zeros_like(a[0]) for _ in range(8)]
    for i in range(8):
        for j in range(8 - i):
            if const_limbs[j] == 0:
                continue
            product = a[i] * U32(const_limbs[j])
            columns[i + j] = columns[i + j] + (product & U32(_MASK16))
            if i + j + 1 < 8:
                columns[i + j + 1] = columns[i + j + 1] + (product >> 16)
    return _carry(columns)


def _add(a: Limbs, b: Limbs) -> Limbs:
    return _carry([x + y for x, y in zip(a, b, strict=True)])


def _step(state: Limbs, inc: Limbs) -> Limbs:
    return _add(_mul_const(state, _PCG_MULT_LIMBS), inc)


def _output(state: Limbs) -> tuple[UInt32[Array, "..."], UInt32[Array, "..."]]:
    """PCG's XSL-RR output: ``rotr64(hi64 ^ lo64, state >> 122)`` as (low word, high word)."""
    lo = (state[0] ^ state[4]) | ((state[1] ^ state[5]) << 16)
    hi = (state[2] ^ state[6]) | ((state[3] ^ state[7]) << 16)
    rot = state[7] >> 10
    swap = rot >= 32
    lo, hi = jnp.where(swap, hi, lo), jnp.where(swap, lo, hi)
    r = rot & U32(31)
    left = (U32(32) - r) & U32(31)  # r == 0 must not shift by 32
    keep = r == 0
    out_lo = jnp.where(keep, lo, (lo >> r) | (hi << left))
    out_hi = jnp.where(keep, hi, (hi >> r) | (lo << left))
    return out_lo, out_hi


class PCG64Stream:
    """numpy's ``Generator(PCG64(seed))`` uint32 draw stream, elementwise over ``seed``'s shape.

    ``advance`` yields the next two uint32 draws (one 64-bit output), which is how numpy's
    buffered ``next_uint32`` hands them out: low half first, then high half.
    """

    def __init__(self, seed: UInt32[Array, "..."]):
        words = _seed_sequence_words(seed.astype(U32))
        initstate = _limbs_from_words((words[0], words[1]), (words[2], words[3]))
        initseq = _limbs_from_words((words[4], words[5]), (words[6], words[7]))
        # inc = (initseq << 1) | 1, limb by limb.
        inc = []
        carry = jnp.ones_like(seed, dtype=U32)
        for limb in initseq:
            shifted = (limb << 1) | carry
            inc.append(shifted & U32(_MASK16))
            carry = shifted >> 16
        self.inc = tuple(inc)
        zero = tuple(jnp.zeros_like(seed, dtype=U32) for _ in range(8))
        state = _step(zero, self.inc)
        state = _add(state, initstate)
        self.state = _step(state, self.inc)

    @staticmethod
    def advance(state: Limbs, inc: Limbs) -> tuple[Limbs, UInt32[Array, "..."], UInt32[Array, "..."]]:
        """One 64-bit output: ``(new_state, low_word, high_word)``. Pure; usable in loops."""
        state = _step(state, inc)
        lo, hi = _output(state)
        return state, lo, hi

    def draws(self, count: int) -> UInt32[Array, "... count"]:
        """The first ``count`` uint32 draws of a fresh generator, stacked on a new last axis.

        A scan, not a Python loop: stacking outputs of one fused expression makes XLA CPU re-derive
        the whole state per output element.
        """

        def step(state, _):
            state, lo, hi = self.advance(state, self.inc)
            return state, jnp.stack([lo, hi], axis=-1)

        _, pairs = jax.lax.scan(step, self.state, None, length=-(-count // 2))
        pairs = jnp.moveaxis(pairs, 0, -2)  # [..., outputs, 2]
        return pairs.reshape(*pairs.shape[:-2], -1)[..., :count]


def feistel_round_keys(seed: UInt32[Array, "..."], right_bits: UInt32[Array, "..."], rounds: int):
    """``rng.integers(0, 1 << right_bits, size=rounds, dtype=uint64)``: shape ``[..., rounds]``.

    A power-of-two bound never rejects under Lemire's method, so each key is the top
    ``right_bits`` bits of one uint32 draw; ``right_bits == 0`` draws nothing and gives zeros.
    """
    draws = PCG64Stream(seed).draws(rounds)
    shift = (U32(32) - right_bits)[..., None]
    keys = draws >> jnp.minimum(shift, U32(31))
    return jnp.where((right_bits == 0)[..., None], U32(0), keys)


def _gcd(a: UInt32[Array, "..."], b: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
    def body(ab):
        a, b = ab
        nonzero = b != 0
        safe_b = jnp.where(nonzero, b, U32(1))
        return jnp.where(nonzero, b, a), jnp.where(nonzero, a % safe_b, b)

    a, _ = jax.lax.while_loop(lambda ab: jnp.any(ab[1] != 0), body, (a, b))
    return a


def lcg_params(seed: UInt32[Array, "..."], length: UInt32[Array, "..."]):
    """Levanter's ``LcgPermutation`` parameters ``(a, b)`` for ``p(x) = (a x + b) mod length``.

    ``a = rng.integers(1, length)`` redrawn until ``gcd(a, length) == 1``, then
    ``b = rng.integers(0, length)``, both by numpy's Lemire rejection sampler on the shared
    buffered uint32 stream. ``length == 1`` gives ``(1, 0)`` without drawing.
    """
    stream = PCG64Stream(seed)
    shape = jnp.shape(length)
    # Loop state: pcg state, buffered high word, whether it is pending, and per-lane progress.
    # phase 0: drawing a; phase 1: drawing b; phase 2: done.
    phase = jnp.where(length <= 1, 2, 0).astype(U32)
    a = jnp.ones(shape, U32)
    b = jnp.zeros(shape, U32)

    def next32(state, buf, has):
        new_state, lo, hi = PCG64Stream.advance(state, stream.inc)
        take_buf = has
        out = jnp.where(take_buf, buf, lo)
        state = tuple(jnp.where(take_buf, s, n) for s, n in zip(state, new_state, strict=True))
        return state, jnp.where(take_buf, buf, hi), ~take_buf, out

    def lemire_step(r32, rng):
        """One Lemire attempt for bound ``rng + 1``: (value, accepted)."""
        excl = rng + U32(1)
        lo, hi = mul_wide(r32, excl)
        threshold = (U32(0xFFFFFFFF) - rng) % jnp.maximum(excl, U32(1))
        accepted = (lo >= excl) | (lo >= threshold)
        return hi, accepted

    def body(carry):
        state, buf, has, phase, a, b = carry
        rng = jnp.where(phase == 0, length - U32(2), length - U32(1))
        needs_draw = (phase < 2) & (rng != 0)
        # numpy returns `low` without drawing when the range is a single value.
        new_state, new_buf, new_has, r32 = next32(state, buf, has)
        state = tuple(jnp.where(needs_draw, n, s) for s, n in zip(state, new_state, strict=True))
        buf = jnp.where(needs_draw, new_buf, buf)
        has = jnp.where(needs_draw, new_has, has)
        value, accepted = lemire_step(r32, rng)
        value = jnp.where(rng == 0, U32(0), value)
        accepted = accepted | (rng == 0)
        in_a = (phase == 0) & accepted
        candidate = value + U32(1)
        coprime = _gcd(candidate, length) == 1
        a = jnp.where(in_a, candidate, a)
        b = jnp.where((phase == 1) & accepted, value, b)
        phase = jnp.where(in_a & coprime, U32(1), phase)
        phase = jnp.where((phase == 1) & accepted & ~in_a, U32(2), phase)
        return state, buf, has, phase, a, b

    carry = (stream.state, jnp.zeros(shape, U32), jnp.zeros(shape, bool), phase, a, b)
    carry = jax.lax.while_loop(lambda c: jnp.any(c[3] < 2), body, carry)
    return carry[4], carry[5]
