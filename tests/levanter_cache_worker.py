"""One process building a Levanter cache (launched by ``test_levanter_build_race.py``).

    python levanter_cache_worker.py MODE PROCESS_ID NUM_PROCESSES PORT ROOT

MODE ``dist``: the processes form one ``jax.distributed`` run (gloo); ``solo``: independent runs
that start building together (each waits for the others' ``ready-<i>`` files under ROOT). Each
builds ``ROOT/cache/train`` from ``ROOT/docs.jsonl`` with ``causal_lm``'s ``build_split`` and saves
what it then reads (every row's tokens, the lengths, the ledger's cache id) to ``ROOT/out-<i>.npz``;
then the same with ``quick_start`` into ``ROOT/quick/train`` (read while it grows, to the end) over a
killed build's leftover there: process 0 takes the lock (or is process 0), and before it removes the
leftover it waits up to 1.5 s for process 1 to open the cache (``opened_early``: a reader that
opens the leftover's rows then reads rows being deleted); then a build failing in
``ROOT/bad.jsonl`` (the error each process saw, in ``failures``); then a quick-start build of
``ROOT/long.jsonl`` that process 0 stops (``close``) once process 1 reads it (what process 1's
``refresh`` then raised, in ``stop_error``).
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

from levanter.store.cache import CacheOptions  # noqa: E402

from meshbatch.cache import TokenCache  # noqa: E402
from meshbatch.cache.builds import CacheBuildFailed  # noqa: E402
from meshbatch.levanter import CausalLMConfig, quick_start  # noqa: E402
from meshbatch.levanter.quick_start import growing_cache  # noqa: E402


def signal(name):
    open(os.path.join(root, name), "w").close()


def signalled(name, timeout):
    deadline = time.monotonic() + timeout
    while not os.path.exists(os.path.join(root, name)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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
opened_early = []
if process_id == 0:
    remove_leftover = quick_start.remove_commit

    def remove_once_the_reader_had_time_to_look(*args):
        quick_start.remove_commit = remove_leftover  # only this build's
        signal("locked")
        opened_early.append(signalled("opened", 1.5))
        remove_leftover(*args)

    quick_start.remove_commit = remove_once_the_reader_had_time_to_look
else:
    assert signalled("locked", 60), "process 0 never took the lock"
grown = growing_cache(quick, quick.cache_dir)  # one process (or run) builds, the others read it grow
signal("opened")
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
stopping = CacheOptions(batch_size=1)  # one document a batch: far from finished when stopped
long = CausalLMConfig(
    tokenizer=config.tokenizer, cache_dir=os.path.join(root, "stopped"), shuffle="era", era_length=4,
    train_urls=[os.path.join(root, "long.jsonl")], quick_start=True, cache_options=stopping,
)  # fmt: skip
stop_error = ""
if process_id == 0:
    building = growing_cache(long, long.cache_dir)
    signal("building")
    assert signalled("reading", 60), "process 1 never read the build"
    building.close()
else:
    assert signalled("building", 60), "process 0 never started the build"
    reading = growing_cache(long, long.cache_dir)
    signal("reading")
    deadline, stop_error = time.monotonic() + 20, "no error 20 s after the build was stopped"
    while time.monotonic() < deadline:
        try:
            reading.refresh()
        except Exception as error:
            stop_error = f"{type(error).__name__} {isinstance(error, CacheBuildFailed)}: {error}"
            break
        time.sleep(0.02)
np.savez(
    os.path.join(root, f"out-{process_id}.npz"),
    opened_early=np.array(opened_early, bool),
    stop_error=np.array(stop_error),
    failures=np.array(json.dumps(failures)),
    quick_tokens=np.concatenate(grown.read_rows(np.arange(grown.num_rows))),
    tokens=np.concatenate(rows),
    lengths=cache.doc_lengths(),
    cache_id=np.array(str(cache.ledger.cache_id)),
)
if mode == "dist":
    jax.distributed.shutdown()
