"""meshbatch: language-model training batches built inside the JAX device mesh."""

from meshbatch.kernels import Batch as Batch
from meshbatch.kernels.permutation import Permutation as Permutation
from meshbatch.kernels.shuffles import BlockShuffle as BlockShuffle
from meshbatch.kernels.shuffles import EraShuffle as EraShuffle

from .shuffle import block_shuffle as block_shuffle
from .shuffle import era_shuffle as era_shuffle
from .shuffle import permutation as permutation

__version__ = "0.1.0"
