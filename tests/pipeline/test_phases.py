"""Host time by phase of a step (``meshbatch.pipeline.telemetry``): recorded only when asked."""

import jax
import numpy as np

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache
from meshbatch.pipeline.telemetry import phase, phase_times


def test_phases_sum_per_name_and_nest():
    with phase_times() as outer:
        with phase("a"):
            pass
        with phase_times() as inner, phase("b"):
            pass
        with phase("a"):
            pass
    assert set(outer) == {"a"} and set(inner) == {"b"} and outer["a"] >= 0.0
    with phase("c"):  # nobody asks: nothing recorded anywhere
        pass
    assert set(outer) == {"a"}


def test_a_step_reports_its_host_phases(cache_path):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    dataset = CausalLMDataset(TokenCache.open(cache_path), 32, shuffle=ShuffleSpec("block", io_block_size=8))
    pipeline = Pipeline(dataset, mesh=mesh, batch_size=16, key=0)
    pipeline.batch(0)
    with phase_times() as times:
        batch = pipeline.batch(1)
    assert set(times) == {"plan", "fetch", "stack", "build", "global"}  # one process: no "place"
    assert all(seconds > 0 for seconds in times.values())
    assert batch.tokens.shape == (16, 32)
