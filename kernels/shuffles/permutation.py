"""Keyed permutations of ``[0, length)``: the building block of every shuffle.

A ``Permutation`` holds its key schedule as arrays and maps indices to indices on device:

    perm = Permutation.create("feistel", 5, key)      # strong default
    perm(jnp.arange(5, dtype=jnp.uint32))            # e.g. [3, 0, 4, 1, 2]
    perm(indices, epoch=2)                           # the order for epoch 2: key fold_in(key, 2)

``compat="levanter"`` reproduces ``levanter.data._prp.Permutation.make(kind, length, key)`` bit for
bit, its numpy key schedule included (see ``pcg64``). Epoch 0 always uses the plain key, so an
epoch-reshuffled stream starts exactly where the plain permutation does.

Indices are uint32; an index outside ``[0, length)`` maps to ``INVALID`` (a traced value cannot
raise; the host-side API checks concrete inputs and raises instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Integer, Key, PRNGKeyArray, UInt32

from ..keys import rewrap, typed_key
from ..uint32 import add_mod, mul_mod
from . import feistel, pcg64

U32 = jnp.uint32
INVALID = feistel.INVALID
Kind = Literal["feistel", "linear"]
Compat = Literal["levanter"] | None
KINDS = ("feistel", "linear")


class LinearNetwork(eqx.Module):
    """``x -> (a x + b) mod length`` with ``gcd(a, length) = 1``; arrays broadcast against the indices.

    Levanter's ``LcgPermutation`` computes ``a * x`` in uint64; here the product is reduced modulo
    ``length`` by double-and-add (``uint32.mul_mod``), every intermediate below ``length < 2^32``:

        length = 10, a = 3, b = 7:  x = 0..9  ->  7, 0, 3, 6, 9, 2, 5, 8, 1, 4
    """

    a: UInt32[Array, "..."]
    b: UInt32[Array, "..."]
    length: UInt32[Array, "..."]

    def __call__(self, x: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
        return add_mod(mul_mod(self.a, x, self.length), self.b, self.length)


def epoch_key(key: Key[Array, ""], epoch: UInt32[Array, "*shape"]) -> Key[Array, "*shape"]:
    """``key`` for epoch 0, ``fold_in(key, epoch)`` after; elementwise over ``epoch``."""
    folded = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, epoch.reshape(-1))
    data = jnp.where(
        (epoch.reshape(-1) == 0)[:, None],
        jax.random.key_data(key)[None, :],
        jax.random.key_data(folded),
    )
    return rewrap(data.reshape(*epoch.shape, data.shape[-1]), key)


def derive_network(kind: Kind, compat: Compat, keys: Key[Array, "*batch"], length: UInt32[Array, "..."]):
    """The network for each key in ``keys`` (any batch shape) and matching ``length``."""
    flat_keys = keys.reshape(-1)
    length = jnp.broadcast_to(length, keys.shape).reshape(-1)
    shape = keys.shape

    def unflat(x, extra=()):
        return x.reshape(*shape, *extra)

    if compat == "levanter":
        seeds = jax.vmap(pcg64.levanter_seed)(flat_keys)
    else:
        seeds = jax.vmap(lambda k: jax.random.bits(k, (), U32))(flat_keys)

    if kind == "linear":
        a, b = pcg64.lcg_params(seeds, length)
        return LinearNetwork(unflat(a), unflat(b), unflat(length))
    if compat == "levanter":
        right_bits = feistel.levanter_right_bits(length)
        keys_ = pcg64.feistel_round_keys(seeds, right_bits, feistel.LEVANTER_ROUNDS)
        return feistel.LevanterNetwork(unflat(keys_, (feistel.LEVANTER_ROUNDS,)), unflat(right_bits))
    round_keys = jax.vmap(lambda k: jax.random.bits(k, (feistel.STRONG_ROUNDS,), U32))(flat_keys)
    a, b = feistel.strong_halves(length)
    return feistel.StrongNetwork(unflat(round_keys, (feistel.STRONG_ROUNDS,)), unflat(a), unflat(b))


# Up to this length a permutation can also be kept as a table (``KeyedShuffle.with_orders``). The
# strong network's domain is at least MIN_HALF^2 = 256 wide, so a walk of a length n that small
# takes about 256 / n passes (n = 5: ~51, and the slowest of a batch's lanes several times more);
# a lookup takes none.
SMALL = 64
# Every network of a length up to SMALL maps the values a walk visits into [0, DOMAIN): the strong
# one is a bijection of [0, 16 * 16), Levanter's of [0, 2^(2 rb)) with 2^(2 rb) <= 4 * SMALL, and
# the linear one stays inside [0, length).
DOMAIN = feistel.MIN_HALF**2
DOUBLINGS = 8  # 2^8 = DOMAIN steps: longer than any walk inside the domain


def small_order(kind: Kind, network: eqx.Module, length: UInt32[Array, ""]) -> UInt32[Array, " small"]:
    """``uint32[SMALL]``: the permutation of ``[0, length)`` by ``network``, then ``INVALID``; all
    ``INVALID`` when ``length > SMALL`` (such a permutation is walked).

    The walk without a loop: one pass of the network over its whole domain gives each value's
    next, a value inside ``[0, length)`` stays where it is, and doubling that map ``DOUBLINGS``
    times takes every value to where its walk lands.
    """
    domain = jnp.arange(DOMAIN, dtype=U32)
    step = jnp.minimum(network(domain), U32(DOMAIN - 1))  # values outside the domain are never visited
    land = jnp.where(domain < length, domain, step)
    for _ in range(DOUBLINGS):
        land = land[land]
    x = domain[:SMALL]
    order = jnp.where(length <= 1, U32(0), land[step[:SMALL]])
    order = jnp.where(x < length, order, U32(INVALID))
    return jnp.where(length <= SMALL, order, U32(INVALID))


def apply_small(
    kind: Kind,
    network,
    order: UInt32[Array, "*lanes small"],
    x: UInt32[Array, " n"],
    length: UInt32[Array, "*n"],
    *,
    batched: bool,
) -> UInt32[Array, " n"]:
    """``apply_network(kind, network(), x, length, batched=batched)``, read from ``order``
    (``small_order`` of the same network; one per lane when ``batched``) for lanes whose length
    is at most ``SMALL``. ``network`` is a function giving the network: it is derived, and the
    other lanes walked, only when some lane needs it."""
    x = x.reshape(-1)
    small = jnp.broadcast_to(length <= U32(SMALL), x.shape)
    index = jnp.minimum(x, U32(SMALL - 1))
    looked = jnp.take_along_axis(order, index[:, None], axis=1)[:, 0] if batched else order[index]
    looked = jnp.where(x < length, looked, U32(INVALID))
    walk = jnp.where(small, U32(INVALID), x)  # out of range: these lanes never walk
    walked = jax.lax.cond(
        jnp.any(walk < length),
        lambda: apply_network(kind, network(), walk, length, batched=batched),
        lambda: walk | U32(INVALID),  # all INVALID, typed as ``walk`` (varying under shard_map)
    )
    return jnp.where(small, looked, walked)


# One compiled key schedule per (kind, compat); lengths and keys are traced, so never recompiled.
_derive_jit = jax.jit(derive_network, static_argnums=(0, 1))


@partial(jax.jit, static_argnums=(0,))
def _small_orders(kind: Kind, network: eqx.Module, length: UInt32[Array, "*members"]):
    """``small_order`` of each member of a stack (leading axis of every leaf), or of one network."""
    if length.ndim == 0:
        return small_order(kind, network, length)
    return jax.vmap(partial(small_order, kind))(network, length)


def apply_network(
    kind: Kind,
    network: eqx.Module,
    x: UInt32[Array, " n"],
    length: UInt32[Array, "*n"],
    *,
    batched: bool,
) -> UInt32[Array, " n"]:
    """Permute ``x`` (1-D); lanes with ``x >= length`` give ``INVALID``, ``length <= 1`` gives 0."""
    if kind == "linear":
        return feistel.masked_pass(network, x, length)
    return feistel.cycle_walk(network, x, length, batched=batched)


def check_indices(indices, length: int, *, name: str = "index", error: type = IndexError) -> None:
    """Raise for concrete indices that are not integers (``TypeError``) or lie outside
    ``[0, length)`` (``error``, naming ``name``); traced ones pass."""
    if isinstance(indices, jax.core.Tracer):
        return
    values = np.asarray(indices)  # numpy, not jnp: without x64, jnp would wrap 2**40 to 0
    if not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"{name} values must be integers (got dtype={values.dtype})")
    if values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= length:
        bad = low if low < 0 else high
        raise error(f"{name} {bad} is out of range for length={length}")


def check_epoch(epoch) -> None:
    """A concrete epoch (scalar or array) must be an integer in ``[0, 2**32)``: never wrapped."""
    check_indices(epoch, 2**32, name="epoch", error=ValueError)


class IndexShuffle(eqx.Module):
    """A keyed bijection of ``[0, length)`` called on index arrays; subclasses define ``_impl``.

    Concrete indices are range-checked here, at the host boundary; the work runs jitted.
    """

    length: UInt32[Array, ""]

    def __call__(
        self,
        indices: Integer[Array | np.ndarray, "*shape"] | Sequence[int],
        epoch: Integer[Array | np.ndarray, "..."] | int | np.integer | None = None,
    ) -> UInt32[Array, "*shape"]:
        """Shuffled indices (uint32, same shape); ``epoch`` may be a scalar or per index
        (broadcast to the indices).

        Host callers pass numpy or Python integers of any integer dtype on purpose: concrete
        indices and epochs are range-checked here, then converted to uint32.
        """
        if not isinstance(self.length, jax.core.Tracer):
            check_indices(indices, int(self.length))
        if not isinstance(indices, jax.Array):  # checked in range: Python ints >= 2**31 included
            indices = np.asarray(indices).astype(np.uint32)
        if epoch is not None:
            check_epoch(epoch)
            if not isinstance(epoch, jax.Array):
                epoch = np.asarray(epoch).astype(np.uint32)
            if epoch.ndim and epoch.shape != np.shape(indices):
                try:
                    shape = np.broadcast_shapes(epoch.shape, np.shape(indices))
                except ValueError:
                    shape = None
                if shape != np.shape(indices):
                    raise ValueError(
                        "epoch must be a scalar or broadcast to the indices' shape (got epoch "
                        f"shape {epoch.shape}, indices shape {np.shape(indices)})"
                    )
                epoch = jnp.broadcast_to(jnp.asarray(epoch, U32), np.shape(indices))
        # An array epoch (never a Python int: eqx.filter_jit would compile once per value).
        epoch = None if epoch is None else jnp.asarray(epoch, U32)
        return _shuffle(self, jnp.asarray(indices), epoch)

    def _impl(self, indices, epoch):
        raise NotImplementedError

    def _lanes(self, indices) -> tuple[UInt32[Array, " n"], Array]:
        """Flat uint32 lanes with out-of-range ones parked at 0, and which lanes were in range."""
        x = indices.reshape(-1).astype(U32)
        valid = x < self.length
        return jnp.where(valid, x, U32(0)), valid


class KeyedShuffle(IndexShuffle):
    """An ``IndexShuffle`` derived from a key with a permutation ``kind`` and ``compat`` mode."""

    key: PRNGKeyArray
    kind: Kind = eqx.field(static=True)
    compat: Compat = eqx.field(static=True)

    def lanes(self, indices: UInt32[Array, " n"], epoch: UInt32[Array, " n"] | None) -> UInt32[Array, " n"]:
        """``indices[i]`` shuffled by shuffle ``i`` (in its epoch ``epoch[i]``): every field of
        ``self`` carries a leading lane axis, one shuffle per lane, as alike shuffles stacked and
        gathered per row (a mixture's rows, each planned by its own child). Lane ``i`` gets what
        shuffle ``i`` alone gives for that index; jittable, unchecked (indices in range)."""
        return self._impl(indices, epoch)

    def with_orders(self) -> KeyedShuffle:
        """This shuffle with tables of its short orders (``small_order``) made, one program for
        every member of a stack: the same orders, looked up instead of walked on the plain key.
        A stack of many small shuffles gains (each lane would walk its own network); a single
        shuffle's lanes share one walk, so it is left without (one program fewer to compile).
        Default: no such table."""
        return self


def _is_none(x) -> bool:
    return x is None


def keys_for(key: Key[Array, "*keys"], epoch) -> tuple[Key[Array, "*lanes"], bool]:
    """A keyed shuffle's key for this call (``epoch_key`` of its epoch) and whether it is per lane.

    ``epoch`` is ``None``, a scalar, or already broadcast to the indices (``_shuffle``). A key with
    a lane axis is a shuffle per lane (``KeyedShuffle.lanes``): its epoch is per lane.
    """
    if key.ndim:
        return (key, True) if epoch is None else (jax.vmap(epoch_key)(key, epoch.reshape(-1)), True)
    if epoch is None:
        return key, False
    if epoch.ndim == 0:
        return epoch_key(key, epoch), False
    return epoch_key(key, epoch.reshape(-1)), True


@eqx.filter_jit
def _shuffle(shuffle: IndexShuffle, indices, epoch):
    if epoch is None or epoch.ndim == 0:
        return shuffle._impl(indices, epoch)
    epoch = jnp.broadcast_to(epoch, indices.shape)
    if epoch.size == 0:
        return shuffle._impl(indices, epoch)
    # A batch almost always lies in one epoch: then the scalar path derives each key schedule once.
    first = epoch.reshape(-1)[0]
    return jax.lax.cond(
        jnp.all(epoch == first),
        lambda: shuffle._impl(indices, first),
        lambda: shuffle._impl(indices, epoch),
    )


class Permutation(KeyedShuffle):
    """A keyed bijection of ``[0, length)``; see the module docstring. ``network`` is the key
    schedule of the plain ``key``, derived once at construction; ``key`` serves per-epoch
    reshuffles. ``order``, when ``with_orders`` made it, is the plain key's ``small_order``.
    """

    network: eqx.Module
    order: UInt32[Array, "*members small"] | None = None

    @classmethod
    def create(cls, kind: Kind, length: int, key: PRNGKeyArray, *, compat: Compat = None) -> Permutation:
        key = typed_key(key)  # raw uint32[2] keys too
        length_arr = jax.device_put(np.uint32(length))  # placed: cheaper than a conversion
        network = _derive_jit(kind, compat, key, length_arr)
        return cls(length=length_arr, key=key, kind=kind, compat=compat, network=network)

    def with_orders(self) -> Permutation:
        """This permutation with its plain key's ``small_order`` (one per member of a stack)."""
        return eqx.tree_at(
            lambda p: p.order, self, _small_orders(self.kind, self.network, self.length), is_leaf=_is_none
        )

    def _impl(self, indices, epoch):
        x = indices.reshape(-1).astype(U32)
        if epoch is None and self.order is not None:  # the plain key's table (one per lane for ``lanes``)
            batched = self.key.ndim > 0
            y = apply_small(self.kind, lambda: self.network, self.order, x, self.length, batched=batched)
            return y.reshape(indices.shape)
        if epoch is None:  # the plain key's network (one per lane for ``lanes``)
            y = apply_network(self.kind, self.network, x, self.length, batched=self.key.ndim > 0)
            return y.reshape(indices.shape)
        keys, batched = keys_for(self.key, jnp.asarray(epoch, U32))
        net = derive_network(self.kind, self.compat, keys, self.length)
        y = apply_network(self.kind, net, x, self.length, batched=batched)
        return y.reshape(indices.shape)
