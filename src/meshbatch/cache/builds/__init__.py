"""Building a missing cache once among the processes and runs that ask for it: claim, publish, wait.

Every process of a ``jax.distributed`` run, and every independent run, may ask for the same
missing cache; two builders writing one place tear it. Three verbs cover every case:

* **claim**: who builds. ``builds_here()``: process 0 of a distributed run (or a lone process).
  ``build_once(path, build)``: builds where no finished cache is, one build at a time: at a local
  path a hidden copy renamed into place when finished; at an object-store URL in place under a
  lease lock object (``store_lock``). ``quick_start_lock(path)``: a quick-start build, which grows
  the cache in place. Every local lock is one ``build_news.flock``.
* **publish** (``build_news``): how the others learn how it ended. A finished build publishes its
  ledger (the cache itself); a failure goes through ``jax.distributed``'s key-value store
  (``report_failure``; ``clear_failure`` before a new build); a quick-start build announces its
  ``cache_id`` and its end (``announce``/``release``: a state file beside a local cache, or the
  key-value store).
* **wait**: ``wait_for_finished(path)`` returns the finished ledger, raises ``CacheBuildFailed``
  with the builder's error as soon as it is published, or ``CacheWaitTimeout`` after
  ``MESHBATCH_CACHE_WAIT_S`` seconds (``waiting.poll_until``: one bounded polling loop for every
  wait); a quick-start reader follows a build's news with ``LocalNews``/``RemoteNews``/``OwnNews``.

    if builds_here():
        clear_failure(path)
        try:
            build_once(path, write_cache)       # True: ours is the cache now; False: another's was
        except Exception as error:
            report_failure(path, error)
            raise
    else:
        wait_for_finished(path)
"""

from .build_news import CacheBuildFailed as CacheBuildFailed
from .build_news import LocalNews as LocalNews
from .build_news import OwnNews as OwnNews
from .build_news import RemoteNews as RemoteNews
from .build_news import announce as announce
from .build_news import builds_here as builds_here
from .build_news import clear_failure as clear_failure
from .build_news import describe as describe
from .build_news import is_local as is_local
from .build_news import lock_path as lock_path
from .build_news import quick_start_lock as quick_start_lock
from .build_news import quick_start_running as quick_start_running
from .build_news import release as release
from .build_news import report_failure as report_failure
from .build_news import take_lock as take_lock
from .build_news import wait_for_finished as wait_for_finished
from .build_once import build_once as build_once
from .store_build import BuildLockLost as BuildLockLost
from .store_lock import ConditionalWritesUnsupported as ConditionalWritesUnsupported
from .waiting import CacheWaitTimeout as CacheWaitTimeout
from .waiting import poll_until as poll_until
from .waiting import wait_seconds as wait_seconds
