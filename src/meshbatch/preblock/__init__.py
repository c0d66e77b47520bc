"""Preblocked document blocks: ``[DOC] ... [EOD]`` packing, shuffle levels, escaping, validation."""

from .escape import EscapingTokenizer as EscapingTokenizer
from .escape import escape as escape
from .escape import unescape as unescape
from .layout import Layout as Layout
from .layout import PackSpec as PackSpec
from .layout import plan_layout as plan_layout
from .store import BlockSource as BlockSource
from .store import Header as Header
from .store import detect_format as detect_format
from .store import open_blocks as open_blocks
from .writer import preblock as preblock
