"""Test configuration, set before jax or meshbatch is imported:

- 8 virtual CPU devices and strict numerics;
- JAX's persistent compilation cache in a directory outside the checkout (``MESHBATCH_TEST_CACHE``,
  default ``~/.cache/meshbatch-tests/jax``), shared by the test workers and, through the
  environment, by every subprocess the tests start (multi-process workers, the demo); a fresh
  clone starts with an empty one and fills it;
- the kernels and the dataset protocol shape-checked at run time (jaxtyping + beartype): every
  call into ``SHAPE_CHECKED`` modules checks its annotations (``shape_checks.py``);
- draccus's help text for a config field looked up once per field, not once per parse
  (``memoize_draccus_help``);
- every test waits for the pipeline warm-ups it started (``warmups_end_with_their_test``).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_NUMPY_DTYPE_PROMOTION"] = "strict"
os.environ["JAX_NUMPY_RANK_PROMOTION"] = "raise"
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.environ.get("MESHBATCH_TEST_CACHE", os.path.expanduser("~/.cache/meshbatch-tests/jax")),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import functools

import jax
import numpy as np
import pytest
from shape_checks import install_shape_checks


def memoize_draccus_help() -> None:
    """Cache draccus's ``get_attribute_docstring`` (a field's help text, read from its class's
    source) for the test session.

    Every ``draccus.parse`` of Levanter's ``TrainLmConfig`` (119 dataclasses, 1221 fields: every
    model and dataset choice) rebuilds the help of every field by scanning its class's source:
    0.4 s of a parse's 0.65 s here. The four config test modules (``test_levanter_config``,
    ``_fields``, ``_field_checks``, ``_mixture_compat``) parse 135 times: 146 to 151 CPU-s
    without the cache, 96 to 99 with it (two alternating pairs). The function is pure for a
    loaded class (draccus carries the same ``lru_cache``, commented out), so what a parse decodes,
    accepts or refuses is unchanged. The ``train_lm`` runs the tests start are fresh interpreters
    and parse as a user's would.
    """
    try:
        from draccus.wrappers import docstring
    except ImportError:  # draccus comes with Levanter; without it nothing here parses a config
        return
    if not hasattr(docstring.get_attribute_docstring, "cache_info"):
        docstring.get_attribute_docstring = functools.lru_cache(maxsize=None)(
            docstring.get_attribute_docstring
        )


pytest_plugins = ["meshbatch.bench.pytest_plugin"]  # the jit_bench fixture users load the same way

install_shape_checks()
memoize_draccus_help()
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

EOS = 1


@pytest.fixture(autouse=True)
def warmups_end_with_their_test():
    """Waits (bounded) for the warm-ups a test's pipelines started in the background: a pipeline
    made and never asked for a batch keeps compiling its programs after the test, and a later
    test in this worker that counts compiles would count them."""
    yield
    from meshbatch.pipeline.prefetch import join_warmups

    join_warmups(timeout_s=300)


@pytest.fixture(scope="session")
def cache_path(tmp_path_factory):
    """A meshbatch cache of 400 documents of random lengths, each ending in EOS=1; tokens 2..9999."""
    from corpora import random_docs, write_docs

    docs = random_docs(np.random.default_rng(0), 400, (2, 10_000), (5, 300), eos=EOS)
    return write_docs(tmp_path_factory.mktemp("pipeline") / "cache", docs)


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
