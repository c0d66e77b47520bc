"""One process of a multi-process pipeline run (launched by ``mp_harness.run_jobs``).

    python mp_worker.py PROCESS_ID NUM_PROCESSES PORT LOCAL_DEVICES OUT MESH_SHAPE JOBS

``JOBS`` is a JSON list of ``[factory, kwargs, steps]`` run one after the other in the same
``jax.distributed`` cluster. ``factory`` is ``module:function`` (a module in tests/):
``function(mesh, **kwargs)`` returns ``(pipeline, report)``, ``report()`` a dict of arrays to save
(e.g. read counters). Writes OUT/job<j>/process<i>.npz: every addressable shard of every leaf of
every step, keyed ``step/leaf/first-last`` by its global row slice, plus the report.
"""

import dataclasses
import importlib
import json
import os
import sys

process_id, num_processes, port, local_devices = (int(a) for a in sys.argv[1:5])
out_dir = sys.argv[5]
mesh_shape = tuple(int(x) for x in sys.argv[6].split("x"))
jobs = json.loads(sys.argv[7])
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local_devices}"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from shape_checks import install_shape_checks  # noqa: E402

install_shape_checks()  # before the factory's module imports meshbatch

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=num_processes, process_id=process_id)
assert jax.process_count() == num_processes and jax.local_device_count() == local_devices

names = ("data", "model")[: len(mesh_shape)]
mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(mesh_shape), names)
for j, (factory, kwargs, steps) in enumerate(jobs):
    module, function = factory.split(":")
    pipeline, report = getattr(importlib.import_module(module), function)(mesh, **kwargs)
    out = {}
    for step in range(steps):
        batch = pipeline.batch(step)
        for field in dataclasses.fields(batch):
            leaf = getattr(batch, field.name)
            if leaf is None:
                continue
            assert not leaf.is_fully_addressable
            for shard in leaf.addressable_shards:
                rows = shard.index[0].indices(leaf.shape[0])
                out[f"{step}/{field.name}/{rows[0]}-{rows[1]}"] = np.asarray(shard.data)
    out.update({f"report/{k}": np.asarray(v) for k, v in report().items()})
    os.makedirs(os.path.join(out_dir, f"job{j}"), exist_ok=True)
    np.savez(os.path.join(out_dir, f"job{j}", f"process{process_id}.npz"), **out)
jax.distributed.shutdown()
