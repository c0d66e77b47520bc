"""Datasets are values: a second ``Pipeline`` over an equal dataset compiles no new program.

The pipeline's programs are module-level and take the dataset's device half as an argument, so
equal datasets (equal but distinct objects: same cache, same arguments) share them, with the same
key or another key of the same shapes. Counted with XLA backend compiles (``compiles.py``); with
per-pipeline jits (the old ``jax.jit(dataset.plan)`` and shard-map closures) every new pipeline
compiled its plan and build again.
"""

import jax
import numpy as np
import pytest
from compiles import count_compiles
from corpora import random_docs, write_docs

from meshbatch import CausalLMDataset, Mixture, Pipeline, ShuffleSpec, SpliceLMDataset
from meshbatch.cache import TokenCache

SEQ, BATCH = 8, 8


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("programs")
    rng = np.random.default_rng(0)
    return [write_docs(root / name, random_docs(rng, 30, (2, 1000), (5, 40))) for name in ("a", "b")]


def causal(paths):
    return CausalLMDataset(TokenCache.open(paths[0]), SEQ, shuffle=ShuffleSpec(reshuffle_each_epoch=True))


def splice_pool(paths):
    cache = TokenCache.open(paths[0])
    spec = dict(seq_len=SEQ, content_length=4, pad_token_id=0, shuffle_per_epoch=True)
    return SpliceLMDataset.from_cache(cache, np.arange(6), pool=True, **spec)


def mixture(paths):
    children = {name: CausalLMDataset(TokenCache.open(p), SEQ) for name, p in zip("ab", paths, strict=True)}
    return Mixture(children, {"a": 0.5, "b": 0.5}, block_size=4)


def tokens(make, paths, key, devices: int) -> np.ndarray:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
    pipeline = Pipeline(make(paths), mesh=mesh, batch_size=BATCH, key=key)
    return np.stack([np.asarray(pipeline.batch(step).tokens) for step in range(2)])


@pytest.mark.parametrize("make", [causal, splice_pool, mixture], ids=lambda f: f.__name__)
@pytest.mark.parametrize("devices", [1, 2])
def test_an_equal_pipeline_compiles_nothing(paths, make, devices):
    first = tokens(make, paths, 3, devices)  # compiles the dataset's plan and build for these shapes
    with count_compiles() as compiles:
        again = tokens(make, paths, 3, devices)  # an equal dataset, distinct objects, the same key
        other = tokens(make, paths, 4, devices)  # another key: other tables of the same shapes
    assert compiles == [], f"{len(compiles)} programs compiled for an equal dataset"
    np.testing.assert_array_equal(again, first)
    assert not np.array_equal(other, first)  # the key still matters: only the programs are shared


def test_a_stream_started_during_the_warm_up_compiles_each_program_once(paths):
    """A stream asked for at once, while the warm-up still compiles (its second worker makes step 1
    beside it), compiles what a stream after a finished warm-up compiles: no program twice."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))

    def compiled(seq: int, wait: bool) -> int:  # a shape no other test compiles
        dataset = CausalLMDataset(TokenCache.open(paths[1]), seq, shuffle=ShuffleSpec("block"))
        with count_compiles() as compiles:
            pipeline = Pipeline(dataset, mesh=mesh, batch_size=BATCH, key=0, workers=2)
            if wait:
                pipeline.warmup()
            with pipeline.iterate_from(0) as stream:
                for _ in range(4):
                    next(stream)
        return len(compiles)

    compiled(SEQ + 1, wait=True)  # what any shape shares (key derivations) is compiled here
    at_once, after = compiled(SEQ + 3, wait=False), compiled(SEQ + 5, wait=True)
    assert at_once == after > 0, f"{at_once} programs compiled at once, {after} after the warm-up"
