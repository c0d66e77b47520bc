"""What the host side (``src/meshbatch``) needs from the kernels beyond their public API: the
tables, enums and helpers its datasets build and pass back in. Not for users: names here may
change with the datasets that use them. ``meshbatch.kernels`` holds the public kernels."""

from .mixtures.interleave_tree import named_salts as named_salts
from .mixtures.stable_mixture import WRAPPED as WRAPPED
from .mixtures.stable_mixture import MixtureSchedule as MixtureSchedule
from .mixtures.stable_mixture import mixture_locate as mixture_locate
from .preblocked.mlm_mask import row_keys as row_keys
from .preblocked.packing import MARKERS as MARKERS
from .preblocked.packing import PACKING_RULES as PACKING_RULES
from .preblocked.packing import PackingRule as PackingRule
from .preblocked.structure import ANOMALY_KINDS as ANOMALY_KINDS
from .preblocked.structure import LITERAL_KINDS as LITERAL_KINDS
from .preblocked.structure import assemble_rows as assemble_rows
from .shuffles.permutation import Compat as Compat
from .shuffles.permutation import KeyedShuffle as KeyedShuffle
from .shuffles.permutation import Kind as Kind
from .splice.frames import DocumentPool as DocumentPool
from .splice.frames import SegmentMode as SegmentMode
from .splice.pairs import UNBOUNDED as UNBOUNDED
from .splice.pairs import BalancedPlacement as BalancedPlacement
from .splice.pairs import JitterMode as JitterMode
from .splice.pairs import PairPlacement as PairPlacement
from .splice.pairs import pair_count as pair_count
from .splice.splice_rows import LanePermutation as LanePermutation
from .splice.splice_rows import SpliceSchedule as SpliceSchedule
