"""Preblocked document blocks: ``[DOC] ... [EOD]`` packing, shuffle levels, escaping, validation,
``BlockDataset`` and masked-LM masking. This module only re-exports; the writer is
``meshbatch.preblock`` (``meshbatch.preblocked.preblock``).
"""

from .dataset import BlockDataset as BlockDataset
from .escape import EscapingTokenizer as EscapingTokenizer
from .escape import escape as escape
from .escape import unescape as unescape
from .layout import Layout as Layout
from .layout import PackSpec as PackSpec
from .layout import plan_layout as plan_layout
from .masking import MLMMasking as MLMMasking
from .sources import BlockSource as BlockSource
from .store import Header as Header
from .store import detect_format as detect_format
from .store import open_blocks as open_blocks
from .validate import BlockReport as BlockReport
from .validate import validate_array as validate_array
from .validate import validate_path as validate_path
from .writer import preblock as preblock
