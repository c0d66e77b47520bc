"""Device-side kernels of meshbatch: pure, jitted JAX; no I/O, no tensorstore, no levanter.

Installed as ``meshbatch.kernels``. This module only re-exports; the host side (``src/meshbatch``)
imports kernels from here and nowhere else.
"""

from .batch import Batch as Batch
from .blocks import assemble_rows as assemble_rows
from .blocks import block_batch as block_batch
from .causal import causal_lm_batch as causal_lm_batch
from .causal import gather_windows as gather_windows
from .interleave import Counts as Counts
from .interleave import Selection as Selection
from .interleave import named_salts as named_salts
from .interleave import select_scan as select_scan
from .interleave import source_salts as source_salts
from .interleave import tie_hash as tie_hash
from .interleave_merge import select_merge as select_merge
from .masking import mlm_mask as mlm_mask
from .masking import row_keys as row_keys
from .mixture import MixtureSchedule as MixtureSchedule
from .mixture import mixture_locate as mixture_locate
from .packing import MARKERS as MARKERS
from .packing import PACKING_RULES as PACKING_RULES
from .packing import PackingRule as PackingRule
from .packing import Placement as Placement
from .packing import pack_plan as pack_plan
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
from .structure import ANOMALY_KINDS as ANOMALY_KINDS
from .structure import LITERAL_KINDS as LITERAL_KINDS
from .structure import Findings as Findings
from .structure import validate_blocks as validate_blocks
