"""Every program a pipeline compiles goes to JAX's persistent compilation cache, and a second
process reads all of them from it: nothing compiles again.

Each case runs ``SCRIPT`` twice, in fresh interpreters sharing a fresh cache directory (every
entry written: no minimum compile time or size); the second run must see no cache miss.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys
import jax
import numpy as np

events = {"hits": 0, "misses": 0}

def listener(name, **kwargs):
    if name == "/jax/compilation_cache/cache_hits":
        events["hits"] += 1
    elif name == "/jax/compilation_cache/cache_misses":
        events["misses"] += 1

jax.monitoring.register_event_listener(listener)

from jax.sharding import Mesh
from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec, SpliceLMDataset, TokenBalancedMixture
from meshbatch.cache import TokenCache

kind, paths = sys.argv[1], sys.argv[2:]
if kind == "causal":
    dataset = CausalLMDataset(TokenCache.open(paths[0]), 32, shuffle=ShuffleSpec("block", io_block_size=16))
elif kind == "splice":
    dataset = SpliceLMDataset.from_cache(
        TokenCache.open(paths[0]), np.arange(8), pool=False, seq_len=32, content_length=16, pad_token_id=0
    )
else:
    children = {f"s{i}": CausalLMDataset(TokenCache.open(p), 32) for i, p in enumerate(paths)}
    dataset = TokenBalancedMixture(children)
mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
pipeline = Pipeline(dataset, mesh=mesh, batch_size=8, key=3)
with pipeline.iterate_from(0) as stream:
    first = [np.asarray(next(stream).tokens) for _ in range(3)]
jax.block_until_ready(pipeline.batch(5))
print("RESULT " + json.dumps({**events, "tokens": int(np.stack(first).sum())}))
"""


def run(kind: str, paths: list[str], cache_dir: str) -> dict:
    env = dict(os.environ)
    env.update(
        JAX_COMPILATION_CACHE_DIR=cache_dir,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        JAX_PLATFORMS="cpu",
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind, *paths], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = [row for row in done.stdout.splitlines() if row.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


# The token-balanced mixture's plan holds no host callback (its count and epoch checks run on the
# host, ``check_state``), so its programs are cached and read back like the others.
CASES = ["causal", "splice", "balanced"]


@pytest.mark.parametrize("kind", CASES)
def test_a_second_process_compiles_nothing(cache_path, tmp_path, kind):
    from meshbatch.cache import CacheWriter

    paths = [cache_path]
    if kind == "balanced":
        other = str(tmp_path / "other")
        with CacheWriter(other) as writer:
            writer.write([[i % 97 + 2] * (i % 50 + 5) + [1] for i in range(200)])
        paths.append(other)
    cache_dir = str(tmp_path / "jax-cache")
    first = run(kind, paths, cache_dir)
    written = sorted(os.listdir(cache_dir))
    assert first["misses"] > 0 and written, first  # the first run wrote entries
    second = run(kind, paths, cache_dir)
    assert second["tokens"] == first["tokens"]
    assert second["misses"] == 0 and second["hits"] > 0, second  # every program read back
    # and nothing written again. (Not hits >= the first run's misses: a program that the warm-up
    # thread and the stream ask for at the same moment can miss, or hit, twice by timing.)
    assert sorted(os.listdir(cache_dir)) == written
