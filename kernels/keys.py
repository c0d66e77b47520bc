"""PRNG keys: the one normaliser every entry point uses (the host re-exports it as ``as_key``).

    typed_key(7)                          -> jax.random.key(7)
    typed_key(jax.random.PRNGKey(7))      -> jax.random.key(7)        # raw uint32[2], wrapped
    typed_key(jax.random.key(7))          -> the same key
    typed_key(None)                       -> TypeError: key must be a JAX PRNG key or an int seed ...
    typed_key(jax.random.split(k, 3))     -> ValueError: key must be a single key (got a batch ...)
    typed_key(jax.random.key(0, impl="rbg"))  -> ValueError: key must be a threefry2x32 key ...

Works on traced keys too (inside ``jit``/``vmap``): only shapes and dtypes are inspected.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Key, UInt32

SEED_LOW, SEED_HIGH = -(2**63), 2**64 - 1  # what jax.random.key accepts


def typed_key(key: object, name: str = "key") -> Key[Array, ""]:
    """A typed, scalar-shaped threefry2x32 key from a typed key (``jax.random.key``), a raw
    ``uint32[2]`` key (``jax.random.PRNGKey``) or an int seed (read as ``jax.random.key(seed)``).

    ``key`` is any object on purpose: this is where a wrong one is named, so the check is here.

    Raises:
        TypeError: ``None``, a float, a bool, a string, or any other non-key (naming ``name``).
        ValueError: a seed outside jax's range, a batch of keys, or an ``rbg``/``unsafe_rbg`` key
            (their bits may change with batching, so per-lane key schedules would disagree).
    """
    if isinstance(key, int | np.integer) and not isinstance(key, bool | np.bool_):
        seed = operator.index(key)
        if seed < SEED_LOW:
            raise ValueError(f"{name} must be >= {SEED_LOW} (got {name}={seed})")
        if seed > SEED_HIGH:
            raise ValueError(f"{name} must be <= {SEED_HIGH} (got {name}={seed})")
        return jax.random.key(seed)
    if not isinstance(key, jax.Array | np.ndarray):
        raise TypeError(f"{name} must be a JAX PRNG key or an int seed (got {name}={key!r})")
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        typed = key
    elif key.dtype == np.uint32 and key.shape[-1:] == (2,):
        typed = jax.random.wrap_key_data(jnp.asarray(key))
    else:
        raise TypeError(
            f"{name} must be a JAX PRNG key or an int seed (got an array of dtype {key.dtype} "
            f"and shape {key.shape})"
        )
    if typed.shape != ():
        raise ValueError(f"{name} must be a single key (got a batch of keys of shape {typed.shape})")
    impl = str(jax.random.key_impl(typed))
    if impl != "threefry2x32":
        raise ValueError(
            f"{name} must be a threefry2x32 key (got impl={impl!r}, whose bits depend on batching)"
        )
    return typed


def rewrap(data: UInt32[Array, "*batch 2"], like: Key[Array, "..."]) -> Key[Array, "*batch"]:
    """Key data ``uint32[..., 2]`` back into keys (batch shape ``...``) of ``like``'s implementation."""
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(like))
