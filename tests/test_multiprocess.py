"""The same global batches from 1 process or several real jax.distributed processes (gloo)."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec
from meshbatch.cache import TokenCache

STEPS = 12  # crosses epoch boundaries of the 400-document cache (~ 250 examples of 32 tokens)
WORKER = os.path.join(os.path.dirname(__file__), "mp_worker.py")


def reference(cache_path, devices: int) -> dict[str, np.ndarray]:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
    spec = ShuffleSpec("block", io_block_size=8, window_blocks=4, reshuffle_each_epoch=True)
    pipeline = Pipeline(
        CausalLMDataset(TokenCache.open(cache_path), 32, shuffle=spec, eos_id=1),
        mesh=mesh,
        batch_size=16,
        key=jax.random.key(7),
    )
    out = {}
    for step in range(STEPS):
        batch = pipeline.batch(step)
        for name in ("tokens", "loss_mask", "segment_ids"):
            out[f"{step}/{name}"] = np.asarray(getattr(batch, name))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_processes(cache_path, tmp_path, processes: int, local_devices: int, mesh_shape: str) -> list[dict]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = os.path.dirname(__file__) + os.pathsep + env.get("PYTHONPATH", "")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                WORKER,
                str(i),
                str(processes),
                str(port),
                str(local_devices),
                cache_path,
                str(tmp_path),
                str(STEPS),
                mesh_shape,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(processes)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} failed:\n{logs[i][-4000:]}"
    return [dict(np.load(tmp_path / f"process{i}.npz")) for i in range(processes)]


@pytest.mark.parametrize(("processes", "local_devices", "mesh_shape"), [(2, 4, "8"), (4, 2, "4x2")])
def test_multi_process_batches_equal_single_process(
    cache_path, tmp_path, processes, local_devices, mesh_shape
):
    want = reference(cache_path, 1)
    np.testing.assert_equal(reference(cache_path, 8), want)  # 1 process x 8 devices
    results = run_processes(cache_path, tmp_path, processes, local_devices, mesh_shape)
    for step in range(STEPS):
        for name in ("tokens", "loss_mask", "segment_ids"):
            rebuilt = np.full_like(want[f"{step}/{name}"], -1)
            for result in results:
                for key, part in result.items():
                    if key.startswith(f"{step}/{name}/"):
                        lo, hi = (int(v) for v in key.rsplit("/", 1)[1].split("-"))
                        rebuilt[lo:hi] = part
            np.testing.assert_array_equal(rebuilt, want[f"{step}/{name}"], err_msg=f"{step=} {name=}")
    # Each process read only its own rows: 16 rows over `processes` hosts, every step.
    for result in results:
        assert int(result["spans_requested"]) == STEPS * 16 // processes
