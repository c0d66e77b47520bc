"""The one key normaliser (``meshbatch.kernels.typed_key``, re-exported by the host as ``as_key``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshbatch.arguments import as_key
from meshbatch.kernels import typed_key


def _bits(key) -> list[int]:
    return np.asarray(jax.random.key_data(key)).tolist()


def test_the_host_uses_the_kernels_normaliser():
    assert as_key is typed_key


@pytest.mark.parametrize(
    "key", [7, np.int64(7), jax.random.key(7), jax.random.PRNGKey(7), np.asarray(jax.random.PRNGKey(7))]
)
def test_seeds_typed_and_raw_keys_give_the_same_typed_key(key):
    out = typed_key(key)
    assert jnp.issubdtype(out.dtype, jax.dtypes.prng_key) and out.shape == ()
    assert _bits(out) == _bits(jax.random.key(7))


def test_traced_keys_are_normalised_inside_jit():
    raw = jax.random.PRNGKey(3)
    assert _bits(jax.jit(lambda k: jax.random.key_data(typed_key(k)))(raw)) == np.asarray(raw).tolist()


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [
        (None, TypeError, "seed must be a JAX PRNG key or an int seed \\(got seed=None\\)"),
        (1.5, TypeError, "seed=1.5"),
        (True, TypeError, "seed=True"),
        (np.zeros(2, np.float32), TypeError, "dtype float32"),
        (2**64, ValueError, "seed must be <= 18446744073709551615"),
        (jax.random.split(jax.random.key(0), 3), ValueError, "a batch of keys of shape \\(3,\\)"),
        (jax.random.key(0, impl="rbg"), ValueError, "threefry2x32 key \\(got impl='rbg'"),
    ],
)
def test_bad_keys_are_named(key, error, match):
    with pytest.raises(error, match=match):
        typed_key(key, "seed")
