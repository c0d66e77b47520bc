"""Device-side kernels of meshbatch: pure, jitted JAX; no I/O, no tensorstore, no levanter.

Installed as ``meshbatch.kernels``. This module only re-exports the public kernels; what the host
side (``src/meshbatch``) needs beyond them (its tables, enums and helpers) is in
``meshbatch.kernels.internal``, and the host imports kernels from these two and nowhere else.
"""

from . import internal as internal
from .batch import Batch as Batch
from .causal_lm import causal_lm_batch as causal_lm_batch
from .causal_lm import gather_windows as gather_windows
from .keys import typed_key as typed_key
from .mixtures.interleave_tree import Counts as Counts
from .mixtures.interleave_tree import Selection as Selection
from .mixtures.interleave_tree import select_tournament as select_tournament
from .mixtures.interleave_tree import source_salts as source_salts
from .mixtures.interleave_tree import tie_hash as tie_hash
from .packed.packed_rows import LOSS_RULES as LOSS_RULES
from .packed.packed_rows import LossRule as LossRule
from .packed.packed_rows import PackedRows as PackedRows
from .packed.packed_rows import PackTables as PackTables
from .packed.packed_rows import first_fit_rows as first_fit_rows
from .packed.packed_rows import greedy_rows as greedy_rows
from .packed.packed_rows import pack_tables as pack_tables
from .packed.packed_rows import packed_rows as packed_rows
from .preblocked.mlm_mask import mlm_mask as mlm_mask
from .preblocked.packing import Placement as Placement
from .preblocked.packing import pack_plan as pack_plan
from .preblocked.structure import Findings as Findings
from .preblocked.structure import block_batch as block_batch
from .preblocked.structure import validate_blocks as validate_blocks
from .shuffles.era_block import BlockShuffle as BlockShuffle
from .shuffles.era_block import EraShuffle as EraShuffle
from .shuffles.permutation import INVALID as INVALID
from .shuffles.permutation import KINDS as KINDS
from .shuffles.permutation import Permutation as Permutation
from .splice.frames import cyclic_read_split as cyclic_read_split
from .splice.frames import pool_frames as pool_frames
from .splice.frames import splice_frames as splice_frames
from .splice.splice_rows import lookup_rows as lookup_rows
