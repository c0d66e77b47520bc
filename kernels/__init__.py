"""Device-side kernels of meshbatch: pure, jitted JAX; no I/O, no tensorstore, no levanter.

Installed as ``meshbatch.kernels``. This module only re-exports; the host side (``src/meshbatch``)
imports kernels from here and nowhere else.
"""

from .batch import Batch as Batch
from .causal import causal_lm_batch as causal_lm_batch
from .causal import gather_windows as gather_windows
from .permutation import COMPATS as COMPATS
from .permutation import INVALID as INVALID
from .permutation import KINDS as KINDS
from .permutation import Compat as Compat
from .permutation import Kind as Kind
from .permutation import Permutation as Permutation
from .permutation import typed_key as typed_key
from .shuffles import BlockShuffle as BlockShuffle
from .shuffles import EraShuffle as EraShuffle
from .splice import DocumentPool as DocumentPool
from .splice import SegmentMode as SegmentMode
from .splice import cyclic_read_split as cyclic_read_split
from .splice import pool_frames as pool_frames
from .splice import splice_frames as splice_frames
from .splice_balanced import BalancedPlacement as BalancedPlacement
from .splice_balanced import JitterMode as JitterMode
from .splice_pairs import UNBOUNDED as UNBOUNDED
from .splice_pairs import PairPlacement as PairPlacement
from .splice_pairs import pair_count as pair_count
from .splice_schedule import LanePermutation as LanePermutation
from .splice_schedule import SpliceSchedule as SpliceSchedule
from .splice_schedule import lookup_rows as lookup_rows
