"""Device-side kernels of meshbatch: pure, jitted JAX; no I/O, no tensorstore, no levanter.

Installed as ``meshbatch.kernels``. This module only re-exports.
"""

from .batch import Batch as Batch
