"""Test configuration: 8 virtual CPU devices and strict numerics, set before jax is imported."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_NUMPY_DTYPE_PROMOTION"] = "strict"
os.environ["JAX_NUMPY_RANK_PROMOTION"] = "raise"

import jax
import numpy as np
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

EOS = 1


@pytest.fixture(scope="session")
def cache_path(tmp_path_factory):
    """A meshbatch cache of 400 documents of random lengths, each ending in EOS=1; tokens 2..9999."""
    from meshbatch.cache import CacheWriter

    path = str(tmp_path_factory.mktemp("pipeline") / "cache")
    rng = np.random.default_rng(0)
    docs = [
        np.append(rng.integers(2, 10_000, rng.integers(5, 300)), EOS).astype(np.int32) for _ in range(400)
    ]
    with CacheWriter(path) as writer:
        writer.write(docs)
    return path


@pytest.fixture(scope="session")
def object_stores():
    """A fake-gcs-server and a moto S3 server on 127.0.0.1, each with a bucket ``meshbatch``.

    GCS is reached through a ``LatencyProxy`` (no delay unless a test sets one): TensorStore reads
    ``TENSORSTORE_GCS_HTTP_URL`` once per process, so a test that needs another GCS server points the
    proxy's ``target_port`` at it. S3 is reached directly (``MESHBATCH_S3_ENDPOINT``). Both stop at
    the end of the session.
    """
    from object_store import GCSServer, LatencyProxy, S3Server, restore_env, use_servers

    gcs = GCSServer()
    started = [gcs]
    try:
        s3 = S3Server()
        started.append(s3)
        gcs_front = LatencyProxy(gcs.port, low=0.0, high=0.0)
        started.append(gcs_front)
        old = use_servers(gcs_front.url, s3.url)
        try:
            yield {"gcs": gcs, "gcs_front": gcs_front, "s3": s3}
        finally:
            restore_env(old)
    finally:
        for server in reversed(started):
            server.stop()
