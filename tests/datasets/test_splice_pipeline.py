"""Splice datasets on the pipeline: pool and fetch give the same batches as SpliceDataset, any mesh."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec
from meshes import mesh_of

import meshbatch
from meshbatch import Pipeline, SpliceLMDataset
from meshbatch.cache import CacheWriter, TokenCache

DOCS = [
    np.random.default_rng(i).integers(3, 1000, n).astype(np.int32)
    for i, n in enumerate((500, 1200, 90, 3000))
]
SPECS = {
    "balanced-jitter-shuffled": dict(
        seq_len=64,
        content_length=48,
        content_start_mode="coverage_balanced",
        alpha=0.5,
        offset_jitter=2,
        balance_mode="by_temperature",
        balance_tau=0.5,
        epoch_length=200,
        shuffle_per_epoch=True,
    ),
    "slide-within-shuffled-axes": dict(
        seq_len=32,
        content_length=8,
        content_start_mode="slide_within",
        content_stride=7,
        offset_stride=5,
        shuffle_content=True,
        shuffle_offsets=True,
    ),
    "slide-windows": dict(seq_len=64, mode="slide", window_stride=50),
    "anchor-by-document": dict(seq_len=600, balance_mode="by_document", eos_token_id=1),
}


@pytest.fixture(scope="module")
def splice_cache(tmp_path_factory):
    """A cache whose rows 1..4 are DOCS, behind an unrelated row 0."""
    path = str(tmp_path_factory.mktemp("splice") / "cache")
    with CacheWriter(path) as writer:
        writer.write([np.full(50, 7, np.int32), *DOCS])
    return path


@pytest.mark.parametrize("name", list(SPECS))
def test_pool_fetch_and_in_memory_equal_splice_dataset(splice_cache, name):
    spec = dict(SPECS[name], pad_token_id=0)
    key = jax.random.key(5)
    cache = TokenCache.open(splice_cache)
    datasets = [
        SpliceLMDataset.from_cache(cache, [1, 2, 3, 4], pool=True, **spec),
        SpliceLMDataset.from_cache(cache, [1, 2, 3, 4], pool=False, **spec),
        SpliceLMDataset(DOCS, **spec),
    ]
    assert [d.fetches for d in datasets] == [False, True, False]
    reference = meshbatch.SpliceDataset(DOCS, **spec, key=key)
    n = len(reference)
    batch = 16
    mesh = mesh_of((4, 2), ("data", "model"))
    pipelines = [Pipeline(d, mesh=mesh, batch_size=batch, key=key) for d in datasets]
    straddle = n // batch  # holds the end of epoch 0 and the start of epoch 1 unless n divides
    for step in (0, 1, straddle, straddle + 3):
        want = reference.get_batch(np.arange(step * batch, (step + 1) * batch))
        for pipeline in pipelines:
            got = pipeline.batch(step)
            for field in ("tokens", "loss_mask", "segment_ids", "doc_idx"):
                np.testing.assert_array_equal(
                    np.asarray(getattr(got, field)), np.asarray(getattr(want, field))
                )
            assert got.tokens.sharding.spec == PartitionSpec("data", None)


def test_fetch_reads_only_this_process_rows(splice_cache):
    cache = TokenCache.open(splice_cache)
    dataset = SpliceLMDataset.from_cache(cache, [2, 4], pool=False, seq_len=64, pad_token_id=0)
    pipeline = Pipeline(  # no warm-up: the reads counted are those of the step asked for
        dataset, mesh=mesh_of((2, 4), ("data", "model")), batch_size=8, key=jax.random.key(0), warmup=False
    )
    cache.counters.reset()
    pipeline.batch(3)
    assert cache.counters.spans_requested == 8  # each row once, though 4 devices hold it


def test_cyclic_roll_needs_the_pool(splice_cache):
    cache = TokenCache.open(splice_cache)
    spec = dict(seq_len=32, content_length=16, content_start_mode="cyclic_roll", pad_token_id=0)
    with pytest.raises(ValueError, match=r"cyclic_roll.*pool=True"):
        SpliceLMDataset.from_cache(cache, [1], pool=False, **spec)
    pooled = SpliceLMDataset.from_cache(cache, [1], pool=True, **spec)
    pipeline = Pipeline(pooled, mesh=mesh_of((2,), ("data",)), batch_size=4, key=jax.random.key(0))
    want = meshbatch.SpliceDataset([DOCS[0]], **spec).get_batch(np.arange(4))
    np.testing.assert_array_equal(np.asarray(pipeline.batch(0).tokens), np.asarray(want.tokens))


@pytest.mark.parametrize(
    ("indices", "match"),
    [
        ([], "at least one document"),
        ([5], "document index 5 out of range for a cache of 5 rows"),
        ([-1], "-1"),
    ],
)
def test_bad_selection(splice_cache, indices, match):
    with pytest.raises(ValueError, match=match):
        SpliceLMDataset.from_cache(TokenCache.open(splice_cache), indices, seq_len=32, pad_token_id=0)


def test_pad_token_is_required():
    with pytest.raises(ValueError, match="pad_token_id=None"):
        SpliceLMDataset(DOCS, seq_len=32)
