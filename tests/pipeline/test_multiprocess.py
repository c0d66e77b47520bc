"""The same global batches from 1 process or several real jax.distributed processes (gloo)."""

import jax
import numpy as np
import pytest
from mp_harness import assemble, run_processes

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache

STEPS = 12  # crosses epoch boundaries of the 400-document cache (~ 250 examples of 32 tokens)
LEAVES = ("tokens", "loss_mask", "segment_ids")


def causal_pipeline(mesh, *, cache_path: str):
    """The pipeline every process builds (a ``mp_worker`` factory): block shuffle, reshuffled."""
    cache = TokenCache.open(cache_path)
    spec = ShuffleSpec("block", io_block_size=8, window_blocks=4, reshuffle_each_epoch=True)
    dataset = CausalLMDataset(cache, 32, shuffle=spec, eos_id=1)
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=16, key=jax.random.key(7))
    return pipeline, lambda: {"spans_requested": cache.counters.spans_requested}


def reference(cache_path, devices: int) -> dict[str, np.ndarray]:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
    pipeline, _ = causal_pipeline(mesh, cache_path=cache_path)
    out = {}
    for step in range(STEPS):
        batch = pipeline.batch(step)
        for name in LEAVES:
            out[f"{step}/{name}"] = np.asarray(getattr(batch, name))
    return out


@pytest.mark.parametrize(("processes", "local_devices", "mesh_shape"), [(2, 4, "8"), (4, 2, "4x2")])
def test_multi_process_batches_equal_single_process(
    cache_path, tmp_path, processes, local_devices, mesh_shape
):
    want = reference(cache_path, 1)
    np.testing.assert_equal(reference(cache_path, 8), want)  # 1 process x 8 devices
    results = run_processes(
        tmp_path,
        processes=processes,
        local_devices=local_devices,
        mesh_shape=mesh_shape,
        factory="test_multiprocess:causal_pipeline",
        kwargs={"cache_path": cache_path},
        steps=STEPS,
    )
    for step in range(STEPS):
        for name in LEAVES:
            expected = want[f"{step}/{name}"]
            got = assemble(results, step=step, leaf=name, like=expected)
            np.testing.assert_array_equal(got, expected, err_msg=f"{step=} {name=}")
    # Each process read only its own rows: 16 rows over `processes` hosts, every step.
    for result in results:
        assert int(result["report/spans_requested"]) == STEPS * 16 // processes
