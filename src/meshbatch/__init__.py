"""meshbatch: language-model training batches built inside the JAX device mesh."""

from meshbatch.kernels import Batch as Batch
from meshbatch.kernels.permutation import Permutation as Permutation
from meshbatch.kernels.shuffles import BlockShuffle as BlockShuffle
from meshbatch.kernels.shuffles import EraShuffle as EraShuffle

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

__version__ = "0.1.0"
