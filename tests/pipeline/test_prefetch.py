"""Prefetcher: order, steady depth, end of stream, errors that are never skipped, no leaked threads."""

import gc
import subprocess
import sys
import threading
import time

import pytest

from meshbatch.pipeline.prefetch import EndOfStream, Prefetcher, StreamClosedError


def _live_prefetch_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("meshbatch-prefetch"))


def make(limit=None, fail_at=None):
    def produce(step):
        if limit is not None and step >= limit:
            raise EndOfStream
        if step == fail_at:
            raise OSError(f"read failed at step {step}")
        return step * 10

    return produce


@pytest.mark.parametrize("workers", [1, 3])
def test_items_arrive_in_order_and_the_stream_ends(workers):
    with Prefetcher(make(limit=50), start=5, depth=4, workers=workers) as stream:
        assert list(stream) == [s * 10 for s in range(5, 50)]
        with pytest.raises(StopIteration):
            next(stream)
    assert stream.stats()["batches"] == 45


def test_a_failed_step_is_raised_again_not_skipped():
    stream = Prefetcher(make(fail_at=2), depth=3, workers=2)
    assert [next(stream), next(stream)] == [0, 10]
    for _ in range(2):
        with pytest.raises(OSError, match="read failed at step 2"):
            next(stream)
    assert stream.step == 2


def test_a_stray_stop_iteration_is_an_error_not_the_end():
    def produce(step):
        if step == 3:
            next(iter([]))  # user code exhausting an iterator by mistake
        return step

    stream = Prefetcher(produce, depth=2)
    with pytest.raises(RuntimeError, match="producing step 3 raised StopIteration"):
        list(stream)  # a for loop does not mistake it for the end of the stream
    with pytest.raises(RuntimeError):
        next(stream)


def test_threads_stop_on_close_at_the_end_and_when_dropped():
    before = _live_prefetch_threads()
    closed = Prefetcher(make(), depth=4, workers=2)
    next(closed)
    closed.close()
    with pytest.raises(StreamClosedError, match=r"closed .* before step 1; .* pipeline.iterate_from\(1\)"):
        next(closed)
    finished = Prefetcher(make(limit=3), depth=2, workers=2)
    assert list(finished) == [0, 10, 20]
    dropped = Prefetcher(make(), depth=4, workers=2)
    next(dropped)
    del dropped
    gc.collect()
    for thread in threading.enumerate():
        if thread.name.startswith("meshbatch-prefetch"):
            thread.join(timeout=10)
    assert _live_prefetch_threads() == before


@pytest.mark.parametrize(
    ("depth", "workers", "match"), [(0, 1, "depth must be"), (2, 3, "workers=3"), (2, 0, "workers")]
)
def test_bad_arguments(depth, workers, match):
    with pytest.raises(ValueError, match=match):
        Prefetcher(make(), depth=depth, workers=workers)


EXIT_CHILD = """
import atexit, sys
import jax, jax.numpy as jnp
from meshbatch.pipeline import prefetch

@jax.jit
def work(x):
    for _ in range(8):
        x = jnp.sin(x) @ jnp.cos(x)
    return x

def produce(step):  # busy inside XLA for a while, as a batch build is
    x = jnp.ones((256, 256)) * step
    for _ in range(50):
        x = work(x)
    return jax.block_until_ready(x)

it = prefetch.Prefetcher(produce, depth=4, workers=2)
next(it)
if sys.argv[1] == "without-hook":
    atexit.unregister(prefetch.stop_all)
print("exiting, producers busy, iterator never closed", flush=True)
"""


@pytest.mark.parametrize("hook", ["with-hook", "without-hook"])
def test_a_program_that_never_closes_its_stream_exits_cleanly(tmp_path, hook):
    """Interpreter exit with producers inside XLA: ``stop_all`` (an ``atexit`` hook) stops them
    first. Without it the daemon threads are ended mid-C++ and the process aborts (exit 134,
    "terminate called after throwing an instance of ''") - the meta-case shows the test can fail."""
    script = tmp_path / "child.py"
    script.write_text(EXIT_CHILD)
    done = subprocess.run([sys.executable, str(script), hook], capture_output=True, text=True, timeout=120)
    assert "producers busy" in done.stdout, done.stderr[-2000:]
    if hook == "with-hook":
        assert done.returncode == 0, done.stderr[-2000:]
    else:
        assert done.returncode != 0


def test_a_closed_stream_keeps_no_batch_made_after_close():
    """Workers in the middle of a step when the stream closes drop what they make."""
    started = threading.Event()

    def produce(step):
        if step > 0:
            started.set()
        time.sleep(0.05)
        return bytearray(1 << 20)

    stream = Prefetcher(produce, depth=3, workers=3)
    next(stream)
    assert started.wait(5)
    stream.close()
    assert stream._workers.done == {}
