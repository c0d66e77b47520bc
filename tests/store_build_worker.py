"""One independent run asking for the cache at an object-store URL (``test_cache_store_builds.py``).

    python store_build_worker.py URL ROOT ID

Writes ``ROOT/ready-<ID>``, waits (at most 60 s) for ``ROOT/go``, then calls ``build_once(URL,
build)`` where ``build`` writes ``docs()`` with a ``CacheWriter`` in 6 commits 0.15 s apart; saves
``{"ours", "built", "rows"}`` (``rows``: what it then reads from the cache) to ``ROOT/out-<ID>.json``.
The object-store servers come from the environment (``tests/object_store.py``'s ``use_servers``).
"""

import json
import logging
import os
import sys
import time

url, root, ident = sys.argv[1], sys.argv[2], sys.argv[3]
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")

from store_build_helpers import docs, slow_build  # noqa: E402

from meshbatch.cache import TokenCache  # noqa: E402
from meshbatch.cache.builds import build_once  # noqa: E402

open(os.path.join(root, f"ready-{ident}"), "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(root, "go")):
    assert time.monotonic() < deadline, "no go file within 60 s"
    time.sleep(0.01)
built: list[str] = []
ours = build_once(url, slow_build(docs(), built))
cache = TokenCache.open(url)
rows = [r.tolist() for r in cache.read_rows(list(range(cache.num_rows)))]
with open(os.path.join(root, f"out-{ident}.json"), "w") as f:
    json.dump({"ours": ours, "built": bool(built), "rows": rows}, f)
