"""The pipeline in one process: exact batches, any mesh, resume, epochs, no recompiles, errors."""

import ast
import importlib
import pathlib
import re
import sys
import textwrap
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiles import count_compiles
from jax.sharding import Mesh, PartitionSpec
from meshes import mesh_of

import meshbatch
from meshbatch import BatchSchedule, CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache

U32 = jnp.uint32
SEQ = 32
EOS = 1


def flat_tokens(path: str) -> np.ndarray:
    cache = TokenCache.open(path)
    return np.concatenate(cache.read_rows(np.arange(cache.num_rows)))


def windows_pipeline(cache_path: str, devices: int, key: int, **kwargs) -> Pipeline:
    """The session cache's ``SEQ``-token windows (default shuffle) over a ``data`` mesh of ``devices``."""
    return Pipeline(
        CausalLMDataset(TokenCache.open(cache_path), SEQ),
        mesh=mesh_of(devices),
        key=jax.random.key(key),
        **kwargs,
    )


def expected_tokens(path, spec: ShuffleSpec, key, batch_size: int, step: int) -> np.ndarray:
    """The reference for a constant batch size: see ``expected_stream``."""
    return expected_stream(path, spec, key, step * batch_size, batch_size)


def expected_stream(path, spec: ShuffleSpec, key, start: int, count: int) -> np.ndarray:
    """Stream examples ``start .. start + count - 1``: order from the shuffle, windows cut from the
    cache's flat tokens, epoch ``g // n`` and position ``g % n`` for stream index ``g``."""
    windows = flat_tokens(path)
    windows = windows[: windows.size // SEQ * SEQ].reshape(-1, SEQ)
    n = windows.shape[0]
    g = np.arange(start, start + count)
    position, epoch = g % n, g // n
    shuffle = CausalLMDataset(TokenCache.open(path), SEQ, shuffle=spec).make(key)[0].shuffle
    if shuffle is None:
        examples = position
    elif spec.reshuffle_each_epoch:
        examples = np.asarray(shuffle(jnp.asarray(position, U32), epoch=jnp.asarray(epoch, U32)))
    else:
        examples = np.asarray(shuffle(jnp.asarray(position, U32)))
    return windows[examples]


SPECS = {
    "none": ShuffleSpec("none"),
    "full": ShuffleSpec("full"),
    "full-levanter": ShuffleSpec("full", compat="levanter"),
    "era": ShuffleSpec("era", era_length=100),
    "block-levanter": ShuffleSpec("block", compat="levanter", io_block_size=16, window_blocks=4),
}


@pytest.mark.parametrize("spec_name", list(SPECS))
def test_batches_match_reference_on_any_local_mesh(cache_path, spec_name):
    spec, key = SPECS[spec_name], jax.random.key(3)
    meshes = [mesh_of((1,), ("data",)), mesh_of((8,), ("data",)), mesh_of((4, 2), ("data", "model"))]
    meshes.append(Mesh(np.array(jax.devices()[:8][::-1]), ("data",)))  # device ids against row order
    pipelines = [
        Pipeline(
            CausalLMDataset(TokenCache.open(cache_path), SEQ, shuffle=spec, eos_id=EOS),
            mesh=m,
            batch_size=16,
            key=key,
        )
        for m in meshes
    ]
    for step in (0, 1, 7):
        want = expected_tokens(cache_path, spec, key, 16, step)
        for pipeline in pipelines:
            batch = pipeline.batch(step)
            np.testing.assert_array_equal(np.asarray(batch.tokens), want)
            chex.assert_shape([batch.tokens, batch.loss_mask, batch.segment_ids], (16, SEQ))
            chex.assert_type([batch.tokens, batch.loss_mask, batch.segment_ids], jnp.int32)
            assert batch.tokens.sharding.spec == PartitionSpec("data", None)
            assert batch.tokens.sharding.mesh is pipeline.mesh


def test_build_applies_causal_masks(cache_path):
    pipeline = Pipeline(
        CausalLMDataset(TokenCache.open(cache_path), SEQ, eos_id=EOS, ignore_id=7),
        mesh=mesh_of((2,), ("data",)),
        batch_size=8,
        key=jax.random.key(0),
    )
    batch = pipeline.batch(0)
    tokens = np.asarray(batch.tokens)
    want_mask = np.ones_like(tokens)
    want_mask[:, -1] = 0
    want_mask[:, :-1] &= tokens[:, 1:] != 7
    np.testing.assert_array_equal(np.asarray(batch.loss_mask), want_mask)
    after_eos = np.zeros_like(tokens)
    after_eos[:, 1:] = tokens[:, :-1] == EOS
    np.testing.assert_array_equal(np.asarray(batch.segment_ids), np.cumsum(after_eos, axis=1))


def test_replicated_rows_are_fetched_once(cache_path):
    cache = TokenCache.open(cache_path)
    pipeline = Pipeline(
        CausalLMDataset(cache, SEQ),
        mesh=mesh_of((2, 4), ("data", "model")),
        batch_size=8,
        key=jax.random.key(0),
        warmup=False,  # counts the reads of the step asked for, none made in the background
    )
    cache.counters.reset()
    pipeline.batch(0)
    assert cache.counters.spans_requested == 8  # 8 rows on 8 devices, each row held by 4 of them


def test_iterate_from_equals_iterating_from_zero(cache_path):
    pipeline = windows_pipeline(cache_path, 4, key=1, batch_size=8)
    stream = pipeline.iterate_from(0)
    from_zero = [np.asarray(next(stream).tokens) for _ in range(6)]
    stream.close()
    resumed = pipeline.iterate_from(4)
    np.testing.assert_array_equal(np.asarray(next(resumed).tokens), from_zero[4])
    np.testing.assert_array_equal(np.asarray(next(resumed).tokens), from_zero[5])
    assert resumed.stats()["batches"] == 2
    resumed.close()


def test_resume_far_away_does_one_step_of_work(cache_path):
    """Step 10**9 (hundreds of millions of epochs in) reads and plans exactly what step 1 does."""
    cache = TokenCache.open(cache_path)
    spec = ShuffleSpec("full", reshuffle_each_epoch=True)
    key = jax.random.key(5)
    pipeline = Pipeline(  # no warm-up: the reads counted are those of the step asked for
        CausalLMDataset(cache, SEQ, shuffle=spec), mesh=mesh_of((2,), ("data",)), batch_size=8, key=key,
        warmup=False,
    )  # fmt: skip
    costs = {}
    for step in (1, 10**9):
        cache.counters.reset()
        batch = pipeline.batch(step)
        costs[step] = cache.counters.as_dict()
        np.testing.assert_array_equal(
            np.asarray(batch.tokens), expected_tokens(cache_path, spec, key, 8, step)
        )
    assert costs[1]["spans_requested"] == costs[10**9]["spans_requested"] == 8


@pytest.mark.parametrize("reshuffle", [False, True])
def test_epochs_continue_past_the_end(cache_path, reshuffle):
    cache = TokenCache.open(cache_path)
    spec = ShuffleSpec("full", reshuffle_each_epoch=reshuffle)
    dataset = CausalLMDataset(cache, SEQ, shuffle=spec)
    n = dataset.num_examples
    batch_size = 16
    pipeline = Pipeline(dataset, mesh=mesh_of((2,), ("data",)), batch_size=batch_size, key=jax.random.key(2))
    straddling = n // batch_size  # this step's batch holds the end of epoch 0 and the start of epoch 1
    got = np.asarray(pipeline.batch(straddling).tokens)
    np.testing.assert_array_equal(
        got, expected_tokens(cache_path, spec, jax.random.key(2), batch_size, straddling)
    )
    epoch0 = np.concatenate([np.asarray(pipeline.batch(s).tokens) for s in range(straddling + 1)])[:n]
    epoch1_start = got[n - straddling * batch_size :]
    assert np.array_equal(epoch1_start, epoch0[: epoch1_start.shape[0]]) != reshuffle


def test_max_epochs_ends_the_stream(cache_path):
    dataset = CausalLMDataset(TokenCache.open(cache_path), SEQ)
    pipeline = Pipeline(
        dataset, mesh=mesh_of((1,), ("data",)), batch_size=64, key=jax.random.key(0), max_epochs=2
    )
    steps = pipeline.num_steps()
    assert steps == 2 * dataset.num_examples // 64
    assert sum(1 for _ in pipeline) == steps
    with pytest.raises(IndexError, match=f"step={steps} is past the end"):
        pipeline.batch(steps)


def test_batch_size_schedule(cache_path):
    schedule = BatchSchedule([(0, 8), (3, 16)])
    key, spec = jax.random.key(4), ShuffleSpec("full")
    dataset = CausalLMDataset(TokenCache.open(cache_path), SEQ, shuffle=spec)
    pipeline = Pipeline(dataset, mesh=mesh_of((8,), ("data",)), batch_size=schedule, key=key)
    batches = [np.asarray(pipeline.batch(s).tokens) for s in range(5)]
    assert [b.shape[0] for b in batches] == [8, 8, 8, 16, 16]
    assert schedule.offset(4) == 3 * 8 + 16
    np.testing.assert_array_equal(np.concatenate(batches), expected_stream(cache_path, spec, key, 0, 56))


def test_no_recompilation_after_the_first_step(cache_path):
    pipeline = Pipeline(
        CausalLMDataset(
            TokenCache.open(cache_path), SEQ, shuffle=ShuffleSpec("block", io_block_size=16), eos_id=EOS
        ),
        mesh=mesh_of((4, 2), ("data", "model")),
        batch_size=16,
        key=jax.random.key(0),
    )
    jax.block_until_ready(pipeline.batch(0))
    with count_compiles() as compiles:
        for step in range(1, 25):  # crosses an epoch boundary too
            jax.block_until_ready(pipeline.batch(step))
    assert compiles == []


def test_prefetch_reports_consumer_wait(cache_path):
    pipeline = windows_pipeline(cache_path, 2, key=0, batch_size=8, prefetch=3)
    stream = pipeline.iterate_from(0)
    for _ in range(5):
        next(stream)
    stats = stream.stats()
    stream.close()
    assert stats["batches"] == 5 and stats["wait_total_s"] >= stats["wait_max_s"] >= 0.0
    whole = pipeline.stats()  # the stream's, plus reads per example over the steps made
    assert whole["batches"] == 5 and whole["examples_made"] >= 5 * 8
    assert 0 < whole["requests_per_example"] <= 1 and whole["bytes_per_example"] >= SEQ * 4
    assert whole["read_batches"] >= 5 and whole["read_p99_s"] >= whole["read_p50_s"] > 0


def test_pipeline_reset_stats_starts_a_window(cache_path):
    """``reset_stats`` (what the Levanter adapter calls after each report) restarts the waits and
    the read counters together: requests per example stay those of the steps made since."""
    pipeline = Pipeline(CausalLMDataset(TokenCache.open(cache_path), SEQ), mesh=mesh_of((2,), ("data",)),
                        batch_size=8, key=jax.random.key(0), prefetch=2, workers=1)  # fmt: skip
    pipeline.reset_stats()  # before any stream: nothing to reset
    with pipeline.iterate_from(0) as stream:
        for _ in range(4):
            next(stream)
        for _ in range(200):  # until the worker has made steps 4 and 5 (depth 2) and idles
            if len(stream.log.made) == 6:
                break
            time.sleep(0.01)
        first = pipeline.stats()
        pipeline.reset_stats()
        for _ in range(3):
            next(stream)
        for _ in range(200):  # until steps 6, 7 and 8 are made and the worker idles again (no step
            if len(stream.log.made) == 3:  # half made: its reads would count, its examples not)
                break
            time.sleep(0.01)
        window = pipeline.stats()
    assert (first["batches"], first["examples_made"], window["batches"]) == (4, 6 * 8, 3), (first, window)
    assert window["examples_made"] == 3 * 8, window  # steps 6, 7, 8: made since the reset
    # every step reads the same: the window's reads per example are the first steps' (without the
    # counters restarted, the reads of steps 0-5 would count against the window's examples)
    assert window["requests_per_example"] == first["requests_per_example"] > 0, (first, window)
    assert window["bytes_per_example"] == first["bytes_per_example"] > 0, (first, window)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(batch_size=6), ValueError, "batch_size=6 must be divisible by the data axes' size 4"),
        (dict(batch_size=8, data_axes="rows"), ValueError, "data axis 'rows' is not a mesh axis"),
        (dict(batch_size=0), ValueError, "batch_size=0"),
        (dict(batch_size=8, max_epochs=0), ValueError, "max_epochs=0"),
    ],
)
def test_bad_pipeline_arguments(cache_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        windows_pipeline(cache_path, 4, key=0, **kwargs)


def test_bad_dataset_arguments(cache_path):
    cache = TokenCache.open(cache_path)
    with pytest.raises(ValueError, match=r"seq_len must be >= 1 \(got seq_len=0\)"):
        CausalLMDataset(cache, 0)
    with pytest.raises(ValueError, match=f"holds {cache.num_tokens} tokens: not one window"):
        CausalLMDataset(cache, cache.num_tokens + 1)
    with pytest.raises(ValueError, match="needs era_length"):
        ShuffleSpec("era")
    with pytest.raises(ValueError, match="strategy='random'"):
        ShuffleSpec("random")


def documented_names() -> dict[str, set[str]]:
    """``module:name`` -> the docs whose Python code blocks import it from meshbatch (``from
    meshbatch[.x] import name``) or use it as ``meshbatch.name``."""
    root = pathlib.Path(__file__).parents[2]
    used: dict[str, set[str]] = {}
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S):
            # a block inside a list item is indented with it
            for node in ast.walk(ast.parse(textwrap.dedent(block), filename=str(doc))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "meshbatch":
                    names = [f"{node.module}:{alias.name}" for alias in node.names]
                elif isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "meshbatch":
                    names = [f"meshbatch:{node.attr}"]
                else:
                    continue
                for name in names:
                    used.setdefault(name, set()).add(doc.name)
    return used


def test_public_names():
    """The top-level names are the defining modules' objects, and every meshbatch name the
    README's and the docs' code blocks use exists: a top-level one is in ``meshbatch.__all__`` (or
    is a subpackage), a deeper one is an attribute or submodule of the module it is imported from."""
    for obj, package in ((Pipeline, "meshbatch.pipeline"), (CausalLMDataset, "meshbatch.datasets")):
        assert obj.__module__.startswith(package + "."), obj.__module__
        assert getattr(sys.modules[obj.__module__], obj.__name__) is obj
    used = documented_names()
    assert {"meshbatch:Pipeline", "meshbatch:CausalLMDataset"} <= set(used), sorted(used)
    missing = []
    for name, docs in sorted(used.items()):
        module, attr = name.split(":")
        if module == "meshbatch" and attr in meshbatch.__all__:
            continue
        if module != "meshbatch" and hasattr(importlib.import_module(module), attr):
            continue
        try:
            importlib.import_module(f"{module}.{attr}")
        except ModuleNotFoundError:
            missing.append(f"{name} (in {', '.join(sorted(docs))})")
    assert not missing, f"the docs use names meshbatch does not have: {missing}"


def test_numpy_steps_are_python_ints_and_never_wrap(cache_path):
    dataset = CausalLMDataset(TokenCache.open(cache_path), SEQ)
    pipeline = Pipeline(dataset, mesh=mesh_of((1,), ("data",)), batch_size=64, key=jax.random.key(0))
    np.testing.assert_array_equal(
        np.asarray(pipeline.batch(np.int64(3)).tokens), np.asarray(pipeline.batch(3).tokens)
    )
    for step in (np.int64(2**59), 2**59, 2**70):  # 2**59 * 64 wraps int64; the epoch passes 2**32
        with pytest.raises(ValueError, match=f"step={int(step)} reaches epoch"):
            pipeline.batch(step)
    for bad, error in ((-1, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="step must be a non-negative int"):
            pipeline.batch(bad)


def test_schedule_refuses_what_it_would_truncate():
    assert BatchSchedule(np.int64(8)).offset(np.int64(3)) == 24
    with pytest.raises(TypeError, match=r"start_step must be an int.*2.9"):
        BatchSchedule([(0, 8), (2.9, 16)])
    with pytest.raises(TypeError, match="batch_size must be an int"):
        BatchSchedule([(0, 8.0)])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(strategy="full", kind="bogus"), "kind='bogus'"),
        (dict(strategy="full", compat="numpy"), "compat='numpy'"),
        (dict(strategy="none", reshuffle_each_epoch=True), "does not shuffle"),
        (dict(strategy="full", era_length=100), "era_length=100 only applies"),
        (dict(strategy="era", era_length=10, io_block_size=4), "only apply to strategy='block'"),
    ],
)
def test_shuffle_spec_checks_everything_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShuffleSpec(**kwargs)


def test_pool_state_is_placed_once_for_all_batch_sizes():
    docs = [np.arange(3, 400, dtype=np.int32), np.arange(5, 900, dtype=np.int32)]
    dataset = meshbatch.SpliceLMDataset(docs, seq_len=32, pad_token_id=0)
    pipeline = Pipeline(
        dataset, mesh=mesh_of((4,), ("data",)), batch_size=[(0, 8), (2, 16), (4, 24)], key=jax.random.key(0)
    )
    pool_tokens = dataset.pool.tokens.shape
    copies = [a for a in jax.live_arrays() if a.shape == pool_tokens and a.dtype == dataset.pool.tokens.dtype]
    assert len(copies) <= 2  # the dataset's own array and one replicated copy on the local devices
    assert [pipeline.batch(s).tokens.shape[0] for s in (0, 2, 4)] == [8, 16, 24]
