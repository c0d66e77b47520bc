"""Real multi-process pipeline runs on localhost (``jax.distributed``, gloo), for any dataset.

    results = run_processes(tmp_path, processes=2, local_devices=4, mesh_shape="8",
                            factory="test_datasets_protocol:toy_pipeline", kwargs={...}, steps=3)
    assemble(results, step=0, leaf="tokens", rows=16)   # the global array, from every process

The factory (``module:function`` in tests/) builds ``(pipeline, report)`` for a mesh; see
``mp_worker.py``. ``run_jobs`` runs several factories in one launch (one cluster start per test
file); the workers inherit the tests' environment, persistent compilation cache included.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np

WORKER = os.path.join(os.path.dirname(__file__), "mp_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_workers(script: str, argvs: list[list[str]], *, timeout: float) -> list[str]:
    """Runs ``script`` once per argument list, all at once, to completion; returns their logs.

    The workers see tests/ and its folders on ``PYTHONPATH`` and not the tests' ``XLA_FLAGS`` /
    ``JAX_PLATFORMS`` (each sets its own devices). A worker still running at ``timeout`` seconds,
    and then every other, is killed (a test stops what it starts); a worker that exits non-zero
    fails the test with its log's tail.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    tests = os.path.dirname(os.path.abspath(__file__))  # the shared helpers, and each folder's tests
    folders = [tests, *sorted(e.path for e in os.scandir(tests) if e.is_dir() and e.name[0] not in "_.")]
    env["PYTHONPATH"] = os.pathsep.join([*folders, env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, script, *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for argv in argvs
    ]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} failed:\n{logs[i][-4000:]}"
    return logs


def run_processes(
    tmp_path, *, processes: int, local_devices: int, mesh_shape: str, factory: str, kwargs: dict, steps: int
) -> list[dict[str, np.ndarray]]:
    """Runs ``processes`` workers to completion; returns each one's saved arrays."""
    jobs = [(factory, kwargs, steps)]
    return run_jobs(
        tmp_path, processes=processes, local_devices=local_devices, mesh_shape=mesh_shape, jobs=jobs
    )[0]


def run_jobs(
    tmp_path, *, processes: int, local_devices: int, mesh_shape: str, jobs: list[tuple[str, dict, int]]
) -> list[list[dict[str, np.ndarray]]]:
    """Runs ``processes`` workers to completion, each running every ``(factory, kwargs, steps)``
    of ``jobs`` in turn on one mesh; returns, per job, each process's saved arrays."""
    args = [str(free_port()), str(local_devices), str(tmp_path), mesh_shape, json.dumps(jobs)]
    run_workers(WORKER, [[str(i), str(processes), *args] for i in range(processes)], timeout=600)
    return [
        [dict(np.load(tmp_path / f"job{j}" / f"process{i}.npz")) for i in range(processes)]
        for j in range(len(jobs))
    ]


def assemble(results: list[dict[str, np.ndarray]], *, step: int, leaf: str, like: np.ndarray) -> np.ndarray:
    """The global ``leaf`` of ``step`` stitched from every process's shards (shaped like ``like``);
    raises if any row is missing."""
    rebuilt = np.full_like(like, -1)
    covered = np.zeros(like.shape[0], bool)
    for result in results:
        for key, part in result.items():
            if key.startswith(f"{step}/{leaf}/"):
                lo, hi = (int(v) for v in key.rsplit("/", 1)[1].split("-"))
                rebuilt[lo:hi] = part
                covered[lo:hi] = True
    assert covered.all(), (
        f"rows {np.flatnonzero(~covered).tolist()} of {leaf} at step {step} came from no process"
    )
    return rebuilt
