"""Every error type meshbatch raises by name, in one place to import and catch from.

    from meshbatch.errors import CacheIntegrityError
    try:
        TokenCache.open(path)
    except CacheIntegrityError as e:   # damaged or hostile cache: the message names file and value
        ...

Each is defined beside the code that raises it; this module only gathers them. The Levanter
adapter's (``ConfigError``, ``DataOrderMismatch``, ``QuickStartBuildError``) load on first use,
since they need ``levanter`` installed. Arguments a caller gets wrong raise the built-in ``ValueError`` or
``TypeError`` with the argument's name and value.
"""

from importlib import import_module

from meshbatch.cache.builds import BuildLockLost as BuildLockLost
from meshbatch.cache.builds import CacheBuildFailed as CacheBuildFailed
from meshbatch.cache.builds import CacheWaitTimeout as CacheWaitTimeout
from meshbatch.cache.builds import ConditionalWritesUnsupported as ConditionalWritesUnsupported
from meshbatch.cache.format.checks import CacheChangedError as CacheChangedError
from meshbatch.cache.format.checks import CacheIntegrityError as CacheIntegrityError
from meshbatch.cache.format.stores import StoreUnavailableError as StoreUnavailableError
from meshbatch.datasets.mixtures.token_balanced import CountOverflowError as CountOverflowError
from meshbatch.datasets.packed.packed_sources import PackedDataError as PackedDataError
from meshbatch.pipeline.prefetch import StreamClosedError as StreamClosedError

_LEVANTER = {
    "ConfigError": "meshbatch.levanter.sources",
    "DataOrderMismatch": "meshbatch.levanter.order",
    "QuickStartBuildError": "meshbatch.levanter.quick_start",
}


def __getattr__(name: str):
    if name in _LEVANTER:
        return getattr(import_module(_LEVANTER[name]), name)
    raise AttributeError(f"module 'meshbatch.errors' has no attribute {name!r}")


# the names imported above (each written once) and the Levanter adapter's
__all__ = sorted([name for name, value in globals().items() if isinstance(value, type)] + [*_LEVANTER])
