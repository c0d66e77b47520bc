"""meshbatch: language-model training batches built inside the JAX device mesh."""

__version__ = "0.1.0"
