"""Pipeline datasets: the protocol (``base``) and its implementations. This module only re-exports."""

from .base import BuildStage as BuildStage
from .base import Content as Content
from .base import Dataset as Dataset
from .base import Plan as Plan
from .base import Rows as Rows
from .base import Spans as Spans
from .base import TokenSource as TokenSource
from .causal import CausalLMDataset as CausalLMDataset
from .splice import SpliceLMDataset as SpliceLMDataset
