"""meshbatch: language-model training batches built inside the JAX device mesh."""

from typing import TYPE_CHECKING

from meshbatch.kernels import Batch as Batch
from meshbatch.kernels.permutation import Permutation as Permutation
from meshbatch.kernels.shuffles import BlockShuffle as BlockShuffle
from meshbatch.kernels.shuffles import EraShuffle as EraShuffle

from .causal import CausalLMDataset as CausalLMDataset
from .causal import ShuffleSpec as ShuffleSpec
from .mixtures import mixture_schedule as mixture_schedule
from .pipeline import Pipeline as Pipeline
from .schedule import BatchSchedule as BatchSchedule
from .select import DocumentSelection as DocumentSelection
from .select import select_documents as select_documents
from .shuffle import block_shuffle as block_shuffle
from .shuffle import era_shuffle as era_shuffle
from .shuffle import permutation as permutation
from .splice import SpliceDataset as SpliceDataset
from .splice import SpliceSpec as SpliceSpec
from .splice import coverage_counts as coverage_counts
from .splice import pairs_per_doc as pairs_per_doc
from .splice import shard_indices as shard_indices
from .splice import splice_batch as splice_batch
from .splice import splice_schedule as splice_schedule
from .splice import splice_validation_set as splice_validation_set
from .splice_lm import SpliceLMDataset as SpliceLMDataset

__version__ = "0.1.0"

# The host-side cache layer imports tensorstore, and importing meshbatch.kernels runs this file: load
# it on first attribute access (PEP 562) so the kernels stay free of I/O dependencies.
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

_CACHE_EXPORTS = frozenset(
    {
        "BlockCache",
        "ByteTokenizer",
        "CacheWriter",
        "HFTokenizer",
        "ReadCounters",
        "ShardedCacheWriter",
        "TokenCache",
        "build_cache",
        "validate_cache",
    }
)


def __getattr__(name: str):
    if name in _CACHE_EXPORTS:
        from . import cache

        return getattr(cache, name)
    raise AttributeError(f"module 'meshbatch' has no attribute {name!r}")
