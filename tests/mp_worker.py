"""One process of a multi-process pipeline run (launched by test_multiprocess.py).

    python mp_worker.py PROCESS_ID NUM_PROCESSES PORT LOCAL_DEVICES CACHE OUT STEPS MESH_SHAPE

Writes OUT/process<i>.npz: every addressable shard of every leaf of every step, keyed by its global
row slice, plus this process's read counters.
"""

import os
import sys

process_id, num_processes, port, local_devices = (int(a) for a in sys.argv[1:5])
cache_path, out_dir, steps = sys.argv[5], sys.argv[6], int(sys.argv[7])
mesh_shape = tuple(int(x) for x in sys.argv[8].split("x"))
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local_devices}"

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=num_processes, process_id=process_id)

from meshbatch import CausalLMDataset, Pipeline, ShuffleSpec  # noqa: E402
from meshbatch.cache import TokenCache  # noqa: E402

assert jax.process_count() == num_processes and jax.local_device_count() == local_devices
names = ("data", "model")[: len(mesh_shape)]
mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(mesh_shape), names)
cache = TokenCache.open(cache_path)
spec = ShuffleSpec("block", io_block_size=8, window_blocks=4, reshuffle_each_epoch=True)
pipeline = Pipeline(
    CausalLMDataset(cache, 32, shuffle=spec, eos_id=1), mesh=mesh, batch_size=16, key=jax.random.key(7)
)

out = {}
for step in range(steps):
    batch = pipeline.batch(step)
    for name in ("tokens", "loss_mask", "segment_ids"):
        leaf = getattr(batch, name)
        assert leaf.shape == (16, 32) and not leaf.is_fully_addressable
        for shard in leaf.addressable_shards:
            rows = shard.index[0].indices(16)
            out[f"{step}/{name}/{rows[0]}-{rows[1]}"] = np.asarray(shard.data)
out["spans_requested"] = np.array(cache.counters.spans_requested)
np.savez(os.path.join(out_dir, f"process{process_id}.npz"), **out)
jax.distributed.shutdown()
