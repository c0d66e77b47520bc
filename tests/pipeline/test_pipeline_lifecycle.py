"""Dropped pipelines and streams end: their threads stop and their batches leave the devices;
a new pipeline makes its first batch in the background (warm-up), exactly the batch asked for."""

import gc
import threading
import time

import jax
import numpy as np
import pytest
from meshes import mesh_of

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache

SEQ = 32
DEADLINE_S = 120.0  # a bound on waiting for threads to stop, not a speed requirement


def make(cache_path, **kwargs) -> Pipeline:
    dataset = CausalLMDataset(TokenCache.open(cache_path), SEQ, shuffle=ShuffleSpec("full"))
    return Pipeline(dataset, mesh=mesh_of(4), batch_size=8, key=jax.random.key(0), **kwargs)


def meshbatch_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("meshbatch-"))


def settle(baseline: list[str]) -> list[str]:
    """Collects garbage until the meshbatch threads are back to ``baseline`` (or the deadline)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        gc.collect()
        now = meshbatch_threads()
        if len(now) <= len(baseline) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def arrays() -> tuple[int, int]:
    live = jax.live_arrays()
    return len(live), sum(a.nbytes for a in live)


def test_dropped_pipelines_and_streams_release_threads_and_buffers(cache_path):
    warm = make(cache_path)
    with warm.iterate_from(0) as stream:
        next(stream)
    del warm, stream
    baseline_threads = settle([])
    gc.collect()
    baseline_arrays = arrays()

    kept = []  # the batches the consumer took are its own; only the pipelines' must go
    for i in range(20):
        pipeline = make(cache_path, prefetch=4, workers=2)
        if i % 2:
            kept.append(next(pipeline.iterate_from(0)))  # a stream never closed
        else:
            for batch in pipeline.iterate_from(3):  # a loop left with break
                kept.append(batch)
                break
        assert len(meshbatch_threads()) >= 1
    del pipeline, batch
    kept_count, kept_bytes = len(kept) * 3, sum(leaf.nbytes for b in kept for leaf in jax.tree.leaves(b))

    assert settle(baseline_threads) == baseline_threads
    gc.collect()
    count, nbytes = arrays()
    assert count <= baseline_arrays[0] + kept_count, (count, baseline_arrays, kept_count)
    assert nbytes <= baseline_arrays[1] + kept_bytes, (nbytes, baseline_arrays, kept_bytes)


def test_a_dropped_stream_stops_while_its_pipeline_lives(cache_path):
    pipeline = make(cache_path, warmup=False)
    baseline = settle([])
    stream = pipeline.iterate_from(0)
    next(stream)
    assert len(meshbatch_threads()) > len(baseline)
    del stream
    assert settle(baseline) == baseline
    assert pipeline.stats()["batches"] == 1  # what the dropped stream measured stays readable
    np.testing.assert_array_equal(
        np.asarray(pipeline.batch(1).tokens), np.asarray(make(cache_path).batch(1).tokens)
    )


def test_a_stream_keeps_its_pipeline(cache_path):
    """A stream of a pipeline nobody else holds keeps streaming."""
    want = [np.asarray(make(cache_path, warmup=False).batch(s).tokens) for s in range(4)]
    stream = make(cache_path).iterate_from(0)
    gc.collect()
    got = [np.asarray(next(stream).tokens) for _ in range(4)]
    stream.close()
    np.testing.assert_array_equal(np.stack(got), np.stack(want))


def wait_ready(pipeline: Pipeline, step: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pipeline.ready(step):
        assert time.monotonic() < deadline, f"step {step} never became ready"
        time.sleep(0.01)


def test_a_new_pipeline_has_batch_0_ready_unasked(cache_path):
    pipeline = make(cache_path)
    wait_ready(pipeline, 0)  # nothing asked for it
    cold = make(cache_path, warmup=False)
    assert not cold.ready(0)
    for step in range(3):
        got, want = pipeline.batch(step), cold.batch(step)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            assert a.sharding == b.sharding
    assert not pipeline.ready(0)  # taken


def test_warm_batch_resumes_from_a_step_and_a_state(cache_path):
    reference = make(cache_path, warmup=False)
    want = {s: np.asarray(reference.batch(s).tokens) for s in range(5, 8)}
    state = {"version": 1, "step": 5}
    resumed = make(cache_path, state=state)  # warms up step 5
    wait_ready(resumed, 5)
    with resumed.iterate_from(state=state) as stream:
        got = [np.asarray(next(stream).tokens) for _ in range(3)]
    np.testing.assert_array_equal(np.stack(got), np.stack([want[s] for s in range(5, 8)]))
    elsewhere = make(cache_path)  # warms up step 0; the stream starts at 6: discarded
    with elsewhere.iterate_from(6) as stream:
        np.testing.assert_array_equal(np.asarray(next(stream).tokens), want[6])


def test_warmup_method_and_errors(cache_path):
    pipeline = make(cache_path, warmup=False)
    assert not pipeline.ready(0)
    pipeline.warmup()
    assert pipeline.ready(0)
    pipeline.warmup(2)  # another step: the warm batch of step 0 is dropped
    assert pipeline.ready(2) and not pipeline.ready(0)
    np.testing.assert_array_equal(
        np.asarray(pipeline.batch(2).tokens), np.asarray(make(cache_path, warmup=False).batch(2).tokens)
    )
    with pytest.raises(TypeError, match="warmup"):
        make(cache_path, warmup="yes")
    ended = make(cache_path, max_epochs=1, warmup=False)
    past = ended.num_steps()
    with pytest.raises(IndexError, match=f"step={past} is past the end"):
        ended.warmup(past)
    with pytest.raises(IndexError, match=f"step={past} is past the end"):  # raised again where used
        ended.batch(past)


def balanced(cache_path, tmp_path_factory, **kwargs) -> Pipeline:
    from meshbatch import TokenBalancedMixture
    from meshbatch.cache import CacheWriter

    other = tmp_path_factory.getbasetemp() / "lifecycle-other"
    if not other.exists():
        with CacheWriter(str(other)) as writer:
            writer.write([np.full(i % 40 + 5, i % 97 + 2, np.int32) for i in range(150)])
    children = {"a": CausalLMDataset(TokenCache.open(cache_path), SEQ),
                "b": CausalLMDataset(TokenCache.open(str(other)), SEQ)}  # fmt: skip
    return Pipeline(TokenBalancedMixture(children), mesh=mesh_of(2), batch_size=8, key=1, **kwargs)


def test_warm_batch_of_a_stateful_dataset(cache_path, tmp_path_factory):
    """Planning step 0 in the background leaves the carried state as planning it on demand: the
    same batches, states and plans made, from step 0 and from a saved state."""
    cold = balanced(cache_path, tmp_path_factory, warmup=False)
    want = [np.asarray(cold.batch(s).tokens) for s in range(4)]
    warm = balanced(cache_path, tmp_path_factory)
    wait_ready(warm, 0)
    with warm.iterate_from(0) as stream:
        got = [np.asarray(next(stream).tokens) for _ in range(4)]
    np.testing.assert_array_equal(np.stack(got), np.stack(want))
    assert warm.state_dict() == cold.state_dict()

    saved = balanced(cache_path, tmp_path_factory, warmup=False)
    saved.batch(0), saved.batch(1)
    state = saved.state_dict()
    resumed = balanced(cache_path, tmp_path_factory, state=state)  # warms up step 2 from the state
    wait_ready(resumed, 2)
    planned = resumed._planner.planned
    np.testing.assert_array_equal(np.asarray(resumed.batch(2).tokens), want[2])
    assert resumed._planner.planned == planned == 1  # the warm plan is the plan: nothing replanned
    np.testing.assert_array_equal(np.asarray(resumed.batch(3).tokens), want[3])
    assert resumed.state_dict() == cold.state_dict()

    reloaded = balanced(cache_path, tmp_path_factory)  # warms up step 0, then loads step 2's state
    reloaded.load_state_dict(state)
    assert not reloaded.ready(0) and not reloaded.ready(2)
    np.testing.assert_array_equal(np.asarray(reloaded.batch(2).tokens), want[2])
