"""Pipeline datasets: the protocol (``protocol``) and its families, one folder each.

``causal`` (windows of a token cache), ``splice/``, ``mixtures/``, ``preblocked/``. This module
only re-exports.
"""

from .causal import CausalLMDataset as CausalLMDataset
from .protocol import BuildStage as BuildStage
from .protocol import Content as Content
from .protocol import Dataset as Dataset
from .protocol import DeviceDataset as DeviceDataset
from .protocol import Plan as Plan
from .protocol import Rows as Rows
from .protocol import Spans as Spans
from .protocol import TokenSource as TokenSource
from .splice.splice_dataset import SpliceLMDataset as SpliceLMDataset
