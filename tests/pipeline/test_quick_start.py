"""Quick start: the pipeline trains on a cache while a writer is still committing it.

A writer thread commits documents in small batches; the pipeline, opened on the unfinished cache,
serves batches as soon as their rows are committed. Every batch holds only rows committed before
it was delivered, the first batch arrives before the writer finishes, and the stream equals the
finished cache's with the same key (cache order and the era shuffle: the orders defined before
the final length is known). Orders that need the final length are refused.
"""

import re
import time

import jax
import numpy as np
import pytest
from meshes import mesh_of
from slow_writer import DOCS, SEQ, STEPS, SlowWriter
from threads import error_within

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import CacheWaitTimeout, CacheWriter, TokenCache

BATCH, ERA = 8, 32


def pipeline_over(cache, spec) -> Pipeline:
    return Pipeline(CausalLMDataset(cache, SEQ, shuffle=spec), mesh=mesh_of(2), batch_size=BATCH, key=5)


@pytest.mark.parametrize(
    "spec",
    [
        ShuffleSpec("none"),
        ShuffleSpec("era", era_length=ERA),
        ShuffleSpec("era", era_length=ERA, compat="levanter"),
    ],
    ids=["none", "era", "era-levanter"],
)
def test_training_starts_before_the_cache_is_finished(tmp_path, spec):
    path = str(tmp_path / "cache")
    writer = SlowWriter(path)
    writer.start()
    assert writer.opened.wait(30) and writer.error is None
    growing = TokenCache.open(path, require_finished=False)
    assert not growing.is_finished
    pipeline = pipeline_over(growing, spec)
    delivered, batches = [], []
    with pipeline.iterate_from(0) as stream:
        for _ in range(STEPS):
            batches.append(np.asarray(next(stream).tokens))
            delivered.append(time.monotonic())
            writer.first_batch.set()
    writer.join(60)
    assert writer.error is None and writer.finished_at is not None
    assert delivered[0] < writer.finished_at, "the first batch waited for the whole cache"

    finished = pipeline_over(TokenCache.open(path), spec)
    examples = np.arange(STEPS * BATCH).reshape(STEPS, BATCH)
    shuffle = finished.dataset.make(jax.random.key(5))[0].shuffle
    for step, got in enumerate(batches):
        np.testing.assert_array_equal(got, np.asarray(finished.batch(step).tokens), err_msg=f"{step=}")
        rows = examples[step]
        if rows.max() >= finished.dataset.num_examples:
            continue  # epoch 1: served after the writer finished
        order = rows if shuffle is None else np.asarray(shuffle(rows.astype(np.uint32)))
        needed = (int(order.max()) + 1) * SEQ
        visible = max((tokens for began, tokens in writer.commits if began <= delivered[step]), default=0)
        assert needed <= visible, f"step {step} read token {needed} before any commit of it began"


def test_orders_that_need_the_final_length_are_refused(tmp_path):
    path = str(tmp_path / "cache")
    with CacheWriter(path) as writer:
        writer.write(DOCS[:10])
        writer.flush()
        growing = TokenCache.open(path, require_finished=False)
        for strategy in ("full", "block"):
            with pytest.raises(ValueError, match=f"shuffle strategy='{strategy}' needs the final length"):
                CausalLMDataset(growing, SEQ, shuffle=ShuffleSpec(strategy))
        dataset = CausalLMDataset(growing, SEQ, shuffle=ShuffleSpec("none"))
        assert not dataset.length_is_final and dataset.wait_for(4) is None
    final = dataset.wait_for(10**6)  # the cache is finished: a new, final dataset
    assert final.length_is_final and final.num_examples == sum(d.size for d in DOCS[:10]) // SEQ
    assert not dataset.length_is_final  # the growing one is a value: unchanged
    assert final.wait_for(10**6) is None


def test_a_wait_for_rows_a_stalled_writer_never_commits_is_bounded(tmp_path, monkeypatch):
    """The writer commits 10 documents and stalls: ``wait_for`` raises ``CacheWaitTimeout`` after
    ``MESHBATCH_CACHE_WAIT_S`` seconds, naming the cache, the wait and the rows it had (it waited
    forever)."""
    path = str(tmp_path / "stalled")
    writer = CacheWriter(path)
    writer.write(DOCS[:10])
    writer.flush()
    dataset = CausalLMDataset(TokenCache.open(path, require_finished=False), SEQ, shuffle=ShuffleSpec("none"))
    monkeypatch.setenv("MESHBATCH_CACHE_WAIT_S", "0.5")
    error = error_within(
        lambda: dataset.wait_for(dataset.num_examples + 1),
        30,
        "wait_for still waits for rows the stalled writer never commits",
    )
    assert isinstance(error, CacheWaitTimeout), error
    message = str(error)
    assert f"cache {path} has 10 rows" in message and "MESHBATCH_CACHE_WAIT_S=0.5" in message, message
    assert re.search(r"after waiting 0\.[5-9] s", message), message
