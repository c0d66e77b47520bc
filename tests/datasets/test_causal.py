"""The causal-LM build kernel against its worked example and Levanter's ``LmExample.causal``."""

import chex
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from levanter.models.lm_model import LmExample

from meshbatch.kernels.causal_lm import causal_lm_batch
from meshbatch.kernels.scan import compact, running_count


def test_worked_example():
    batch = causal_lm_batch(jnp.array([[5, 6, 2, 7, 8]]), eos_id=2, ignore_id=8)
    assert batch.tokens.tolist() == [[5, 6, 2, 7, 8]]
    assert batch.loss_mask.tolist() == [[1, 1, 1, 0, 0]]
    assert batch.segment_ids.tolist() == [[0, 0, 0, 1, 1]]


@pytest.mark.parametrize(("eos_id", "ignore_id"), [(None, None), (3, None), (None, 4), (3, 4), (3, 3)])
def test_equals_levanter_lm_example_causal(eos_id, ignore_id):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, size=(16, 33)).astype(np.int32)
    tokens[0, 0] = 3 if eos_id is not None else tokens[0, 0]  # an EOS in the first position
    batch = jax.jit(lambda t: causal_lm_batch(t, eos_id=eos_id, ignore_id=ignore_id))(jnp.asarray(tokens))
    chex.assert_shape([batch.tokens, batch.loss_mask, batch.segment_ids], (16, 33))
    chex.assert_type([batch.tokens, batch.loss_mask, batch.segment_ids], jnp.int32)
    pos = hax.Axis("position", 33)
    for row in range(16):
        with jax.numpy_dtype_promotion("standard"):  # Levanter's own code mixes float32 and bool
            example = LmExample.causal(
                hax.named(jnp.asarray(tokens[row]), pos), eos_id=eos_id, ignore_id=ignore_id
            )
        np.testing.assert_array_equal(batch.loss_mask[row], example.loss_mask.array)
        if eos_id is None:
            assert example.attn_mask.segment_ids is None
            np.testing.assert_array_equal(batch.segment_ids[row], 0)
        else:
            np.testing.assert_array_equal(batch.segment_ids[row], example.attn_mask.segment_ids[0].array)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 128), (4, 129), (8, 4096), (2, 10_000)])
def test_running_count_is_an_exact_cumsum(shape):
    flags = np.random.default_rng(shape[1]).random(shape) < 0.3
    got = jax.jit(running_count)(jnp.asarray(flags))
    chex.assert_type(got, jnp.int32)
    np.testing.assert_array_equal(np.asarray(got), np.cumsum(flags, axis=-1))


@pytest.mark.parametrize(
    ("n", "size", "density"), [(1, 1, 1.0), (5, 4, 0.6), (1000, 100, 0.05), (130_000, 16_000, 0.1)]
)
def test_compact_equals_nonzero(n, size, density):
    flags = jnp.asarray(np.random.default_rng(n).random(n) < density)
    want = jnp.nonzero(flags, size=size, fill_value=n)[0]
    np.testing.assert_array_equal(jax.jit(compact, static_argnames="size")(flags, size=size), want)
