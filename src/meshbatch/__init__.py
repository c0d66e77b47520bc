"""meshbatch: language-model training batches built inside the JAX device mesh.

Public names load on first use. Importing ``meshbatch.kernels`` (pure device code) runs this file
first, as Python does for any subpackage; so that it pulls in no host module (tensorstore, the
pipeline, the cache layer), the names below are resolved from their modules only when asked for.
"""

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Batch": "meshbatch.kernels",
    "BlockShuffle": "meshbatch.kernels",
    "EraShuffle": "meshbatch.kernels",
    "Permutation": "meshbatch.kernels",
    "permutation": "meshbatch.shuffle",
    "era_shuffle": "meshbatch.shuffle",
    "block_shuffle": "meshbatch.shuffle",
    "ShuffleSpec": "meshbatch.shuffle",
    "BatchSchedule": "meshbatch.schedule",
    "Pipeline": "meshbatch.pipeline",
    "Dataset": "meshbatch.datasets",
    "CausalLMDataset": "meshbatch.datasets",
    "SpliceLMDataset": "meshbatch.datasets",
    "DocumentSelection": "meshbatch.select",
    "select_documents": "meshbatch.select",
    "SpliceSpec": "meshbatch.splice",
    "SpliceDataset": "meshbatch.datasets.splice_indexed",
    "splice_schedule": "meshbatch.splice",
    "splice_batch": "meshbatch.datasets.splice_indexed",
    "splice_validation_set": "meshbatch.datasets.splice_indexed",
    "coverage_counts": "meshbatch.splice",
    "pairs_per_doc": "meshbatch.splice",
    "shard_indices": "meshbatch.datasets.splice_indexed",
    "BlockCache": "meshbatch.cache",
    "ByteTokenizer": "meshbatch.cache",
    "CacheWriter": "meshbatch.cache",
    "HFTokenizer": "meshbatch.cache",
    "ReadCounters": "meshbatch.cache",
    "ShardedCacheWriter": "meshbatch.cache",
    "TokenCache": "meshbatch.cache",
    "build_cache": "meshbatch.cache",
    "validate_cache": "meshbatch.cache",
    "Mixture": "meshbatch.mixtures",
    "TokenBalancedMixture": "meshbatch.mixtures",
    "mixture_schedule": "meshbatch.mixtures",
    "preblock": "meshbatch.preblocked",
    "PackSpec": "meshbatch.preblocked",
    "BlockDataset": "meshbatch.preblocked",
    "MLMMasking": "meshbatch.preblocked",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .cache import BlockCache as BlockCache
    from .cache import ByteTokenizer as ByteTokenizer
    from .cache import CacheWriter as CacheWriter
    from .cache import HFTokenizer as HFTokenizer
    from .cache import ReadCounters as ReadCounters
    from .cache import ShardedCacheWriter as ShardedCacheWriter
    from .cache import TokenCache as TokenCache
    from .cache import build_cache as build_cache
    from .cache import validate_cache as validate_cache
    from .datasets import CausalLMDataset as CausalLMDataset
    from .datasets import Dataset as Dataset
    from .datasets import SpliceLMDataset as SpliceLMDataset
    from .datasets.splice_indexed import SpliceDataset as SpliceDataset
    from .datasets.splice_indexed import shard_indices as shard_indices
    from .datasets.splice_indexed import splice_batch as splice_batch
    from .datasets.splice_indexed import splice_validation_set as splice_validation_set
    from .kernels import Batch as Batch
    from .kernels import BlockShuffle as BlockShuffle
    from .kernels import EraShuffle as EraShuffle
    from .kernels import Permutation as Permutation
    from .mixtures import Mixture as Mixture
    from .mixtures import TokenBalancedMixture as TokenBalancedMixture
    from .mixtures import mixture_schedule as mixture_schedule
    from .pipeline import Pipeline as Pipeline
    from .preblocked import BlockDataset as BlockDataset
    from .preblocked import MLMMasking as MLMMasking
    from .preblocked import PackSpec as PackSpec
    from .preblocked import preblock as preblock
    from .schedule import BatchSchedule as BatchSchedule
    from .select import DocumentSelection as DocumentSelection
    from .select import select_documents as select_documents
    from .shuffle import ShuffleSpec as ShuffleSpec
    from .shuffle import block_shuffle as block_shuffle
    from .shuffle import era_shuffle as era_shuffle
    from .shuffle import permutation as permutation
    from .splice import SpliceSpec as SpliceSpec
    from .splice import coverage_counts as coverage_counts
    from .splice import pairs_per_doc as pairs_per_doc
    from .splice import splice_schedule as splice_schedule


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'meshbatch' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
