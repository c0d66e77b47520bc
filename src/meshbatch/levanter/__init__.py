"""Levanter drop-ins (the only package that imports levanter and haliax); see docs/levanter.md.

* ``datasets``: ``AsyncDataset``s for Levanter's ``DataLoader`` (``MeshbatchDataset`` over any
  meshbatch dataset, the in-memory splice datasets, marin's ``BlockShufflingDataset``);
* ``config``, ``splice_config``, ``mixture_config``, ``sources``: the ``data:`` config types a
  Levanter YAML names (draccus), Levanter's own config classes extended; ``caches``: caches
  built by Levanter's machinery; ``fields``: every Levanter field honoured or refused;
* ``fast``: ``PipelineLoader``, global batches from ``Pipeline`` for Levanter's training loop,
  and the data state and order saved with each checkpoint;
* ``train_lm``: ``python -m meshbatch.levanter.train_lm --config_path cfg.yaml`` (``data:``
  decoded with the useful error first).
"""

from .async_datasets import BlockShufflingDataset as BlockShufflingDataset
from .async_datasets import MeshbatchDataset as MeshbatchDataset
from .async_datasets import MultiSpliceDocumentDataset as MultiSpliceDocumentDataset
from .async_datasets import SpliceDocumentDataset as SpliceDocumentDataset
from .async_datasets import lm_examples as lm_examples
from .async_datasets import loader_key as loader_key
from .config import CausalLMConfig as CausalLMConfig
from .config import MeshbatchLMConfig as MeshbatchLMConfig
from .fast import PipelineLoader as PipelineLoader
from .fast import batched_lm_example as batched_lm_example
from .fast import fast_path as fast_path
from .fields import FIELDS as FIELDS
from .mixture_config import StableMixtureLMConfig as StableMixtureLMConfig
from .mixture_config import TokenBalancedMixtureLMConfig as TokenBalancedMixtureLMConfig
from .sources import BaseDataConfig as BaseDataConfig
from .sources import ConfigError as ConfigError
from .sources import MixtureBaseConfig as MixtureBaseConfig
from .sources import UrlBaseConfig as UrlBaseConfig
from .splice_config import SpliceMultiDocumentLMConfig as SpliceMultiDocumentLMConfig
from .splice_config import SpliceSingleDocumentLMConfig as SpliceSingleDocumentLMConfig
