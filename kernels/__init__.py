"""Device-side kernels of meshbatch: pure, jitted JAX; no I/O, no tensorstore, no levanter.

Installed as ``meshbatch.kernels``. This module only re-exports.
"""

from .batch import Batch as Batch
from .permutation import INVALID as INVALID
from .permutation import Permutation as Permutation
from .shuffles import BlockShuffle as BlockShuffle
from .shuffles import EraShuffle as EraShuffle
