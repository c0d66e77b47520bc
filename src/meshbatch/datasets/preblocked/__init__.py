"""Preblocked document blocks: ``[DOC] ... [EOD]`` packing, shuffle levels, escaping, validation,
``BlockDataset`` (a store), ``CacheBlockDataset`` (a token cache packed on the fly) and masked-LM
masking. This module only re-exports; the writer is ``meshbatch.preblock``
(``meshbatch.datasets.preblocked.preblock``).
"""

from .block_dataset import BlockDataset as BlockDataset
from .block_dataset import CacheBlockDataset as CacheBlockDataset
from .block_dataset import MLMMasking as MLMMasking
from .block_sources import BlockSource as BlockSource
from .block_sources import open_blocks as open_blocks
from .block_store import Header as Header
from .block_store import detect_format as detect_format
from .block_validation import BlockReport as BlockReport
from .block_validation import validate_array as validate_array
from .block_validation import validate_path as validate_path
from .block_writer import EscapingTokenizer as EscapingTokenizer
from .block_writer import escape as escape
from .block_writer import preblock as preblock
from .block_writer import unescape as unescape
from .pack_layout import Layout as Layout
from .pack_layout import PackSpec as PackSpec
from .pack_layout import plan_layout as plan_layout
