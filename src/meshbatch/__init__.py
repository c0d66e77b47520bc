"""meshbatch: language-model training batches built inside the JAX device mesh."""

from meshbatch.kernels import Batch as Batch
from meshbatch.kernels.permutation import Permutation as Permutation
from meshbatch.kernels.shuffles import BlockShuffle as BlockShuffle
from meshbatch.kernels.shuffles import EraShuffle as EraShuffle

from .shuffle import block_shuffle as block_shuffle
from .shuffle import era_shuffle as era_shuffle
from .shuffle import permutation as permutation

__version__ = "0.1.0"
from .cache import BlockCache as BlockCache
from .cache import ByteTokenizer as ByteTokenizer
from .cache import CacheWriter as CacheWriter
from .cache import HFTokenizer as HFTokenizer
from .cache import ReadCounters as ReadCounters
from .cache import ShardedCacheWriter as ShardedCacheWriter
from .cache import TokenCache as TokenCache
from .cache import build_cache as build_cache
from .cache import validate_cache as validate_cache
