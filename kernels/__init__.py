"""Device-side kernels of meshbatch: pure, jitted JAX; no I/O, no tensorstore, no levanter.

Installed as ``meshbatch.kernels``. This module only re-exports.
"""

from .batch import Batch as Batch
from .permutation import INVALID as INVALID
from .permutation import Permutation as Permutation
from .shuffles import BlockShuffle as BlockShuffle
from .shuffles import EraShuffle as EraShuffle
from .splice import DocumentPool as DocumentPool
from .splice import cyclic_read_split as cyclic_read_split
from .splice import pool_frames as pool_frames
from .splice import splice_frames as splice_frames
from .splice_balanced import BalancedPlacement as BalancedPlacement
from .splice_pairs import PairPlacement as PairPlacement
from .splice_schedule import SpliceSchedule as SpliceSchedule
from .splice_schedule import lookup_rows as lookup_rows
