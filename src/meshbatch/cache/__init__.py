"""Host-side token caches: Levanter's on-disk format, read coalesced and written resumably."""

from .arrays import DEFAULT_CHUNK_SIZE as DEFAULT_CHUNK_SIZE
from .arrays import shared_context as shared_context
from .build import build_cache as build_cache
from .build import iter_documents as iter_documents
from .checks import CacheChangedError as CacheChangedError
from .checks import CacheIntegrityError as CacheIntegrityError
from .coalesce import Coalesced as Coalesced
from .coalesce import ReadCounters as ReadCounters
from .coalesce import RunRead as RunRead
from .coalesce import SpanRead as SpanRead
from .coalesce import coalesce_spans as coalesce_spans
from .ledger import Ledger as Ledger
from .ledger import read_ledger as read_ledger
from .lru import BlockCache as BlockCache
from .reader import TokenCache as TokenCache
from .reads import PendingRead as PendingRead
from .reads import run_reads as run_reads
from .sharded_writer import ShardedCacheWriter as ShardedCacheWriter
from .stores import StoreUnavailableError as StoreUnavailableError
from .stores import kvstore_spec as kvstore_spec
from .tokenizers import ByteTokenizer as ByteTokenizer
from .tokenizers import HFTokenizer as HFTokenizer
from .tokenizers import Tokenizer as Tokenizer
from .validation import ValidationReport as ValidationReport
from .validation import validate_cache as validate_cache
from .writer import CacheWriter as CacheWriter
