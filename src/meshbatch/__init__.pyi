# The public names of ``meshbatch``, written once: type checkers read this stub, and
# ``__init__.py`` reads it to resolve each name lazily from its module.
from .batch_schedule import BatchSchedule as BatchSchedule
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
from .datasets import DeviceDataset as DeviceDataset
from .datasets import SpliceLMDataset as SpliceLMDataset
from .datasets.mixtures import Mixture as Mixture
from .datasets.mixtures import TokenBalancedMixture as TokenBalancedMixture
from .datasets.mixtures import mixture_schedule as mixture_schedule
from .datasets.packed import PackedDataError as PackedDataError
from .datasets.packed import PackedDataset as PackedDataset
from .datasets.preblocked import BlockDataset as BlockDataset
from .datasets.preblocked import CacheBlockDataset as CacheBlockDataset
from .datasets.preblocked import MLMMasking as MLMMasking
from .datasets.preblocked import PackSpec as PackSpec
from .datasets.preblocked import preblock as preblock
from .datasets.splice import SpliceSpec as SpliceSpec
from .datasets.splice import coverage_counts as coverage_counts
from .datasets.splice import pairs_per_doc as pairs_per_doc
from .datasets.splice import splice_schedule as splice_schedule
from .datasets.splice.indexed import SpliceDataset as SpliceDataset
from .datasets.splice.indexed import shard_indices as shard_indices
from .datasets.splice.indexed import splice_batch as splice_batch
from .datasets.splice.indexed import splice_validation_set as splice_validation_set
from .datasets.splice.selection import DocumentSelection as DocumentSelection
from .datasets.splice.selection import select_documents as select_documents
from .kernels import Batch as Batch
from .kernels import BlockShuffle as BlockShuffle
from .kernels import EraShuffle as EraShuffle
from .kernels import Permutation as Permutation
from .pipeline import Pipeline as Pipeline
from .shuffles import ShuffleSpec as ShuffleSpec
from .shuffles import block_shuffle as block_shuffle
from .shuffles import era_shuffle as era_shuffle
from .shuffles import permutation as permutation

__version__: str
