"""Test configuration: 8 virtual CPU devices and strict numerics, set before jax is imported."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_NUMPY_DTYPE_PROMOTION"] = "strict"
os.environ["JAX_NUMPY_RANK_PROMOTION"] = "raise"

import jax

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
