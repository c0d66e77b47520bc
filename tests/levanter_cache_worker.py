"""One process building a Levanter cache (launched by ``test_levanter_build_race.py``).

    python levanter_cache_worker.py MODE PROCESS_ID NUM_PROCESSES PORT ROOT

MODE ``dist``: the processes form one ``jax.distributed`` run (gloo); ``solo``: independent runs
that start building together (each waits for the others' ``ready-<i>`` files under ROOT). Each
builds ``ROOT/cache/train`` from ``ROOT/docs.jsonl`` with ``causal_lm``'s ``build_split`` and saves
what it then reads (every row's tokens, the lengths, the ledger's cache id) to ``ROOT/out-<i>.npz``;
then the same with ``quick_start`` into ``ROOT/quick/train`` (read while it grows, to the end); then
a build failing in ``ROOT/bad.jsonl`` (the error each process saw, in ``failures``).
"""

import json
import os
import sys
import time

mode, root = sys.argv[1], sys.argv[5]
process_id, num_processes, port = (int(a) for a in sys.argv[2:5])
os.environ["JAX_PLATFORMS"] = "cpu"

import logging  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")

if mode == "dist":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=num_processes, process_id=process_id)
    assert jax.process_count() == num_processes
else:
    open(os.path.join(root, f"ready-{process_id}"), "w").close()
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(root, f"ready-{i}")) for i in range(num_processes)):
        assert time.monotonic() < deadline, "the other workers never started"
        time.sleep(0.01)

from meshbatch.cache import TokenCache  # noqa: E402
from meshbatch.levanter import CausalLMConfig  # noqa: E402
from meshbatch.levanter.quick_start import growing_cache  # noqa: E402

cache_dir = os.path.join(root, "cache")
config = CausalLMConfig(
    tokenizer=os.path.join(root, "tok"), cache_dir=cache_dir, train_urls=[os.path.join(root, "docs.jsonl")]
)
path = config.build_split(config, "train", cache_dir)
cache = TokenCache.open(path)
rows = cache.read_rows(np.arange(cache.num_rows))
quick = CausalLMConfig(
    tokenizer=config.tokenizer, cache_dir=os.path.join(root, "quick"), train_urls=config.train_urls,
    shuffle="era", era_length=4, quick_start=True,
)  # fmt: skip
grown = growing_cache(quick, quick.cache_dir)  # one process (or run) builds, the others read it grow
deadline = time.monotonic() + 60
while not grown.is_finished:
    assert time.monotonic() < deadline, "the quick-start cache never finished"
    grown.refresh()
    time.sleep(0.02)
failures = {}
for name, urls in (("bad", [*config.train_urls, os.path.join(root, "bad.jsonl")]),):
    bad = CausalLMConfig(tokenizer=config.tokenizer, cache_dir=os.path.join(root, name), train_urls=urls)
    try:
        bad.build_split(bad, "train", bad.cache_dir)
    except Exception as error:  # what each process saw
        failures[name] = f"{type(error).__name__}: {error} {getattr(error, '__notes__', [])}"
np.savez(
    os.path.join(root, f"out-{process_id}.npz"),
    failures=np.array(json.dumps(failures)),
    quick_tokens=np.concatenate(grown.read_rows(np.arange(grown.num_rows))),
    tokens=np.concatenate(rows),
    lengths=cache.doc_lengths(),
    cache_id=np.array(str(cache.ledger.cache_id)),
)
if mode == "dist":
    jax.distributed.shutdown()
