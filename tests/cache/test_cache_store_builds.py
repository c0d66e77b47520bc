"""Independent runs asking for one missing cache at an object-store URL get one build, one cache.

Real servers on 127.0.0.1 (``object_stores``: moto's S3 server, fake-gcs-server). The build lock
(``meshbatch.cache.builds.store_lock``) is a TensorStore conditional write: moto honours S3's
``If-None-Match`` / ``If-Match``, so S3 runs are kept apart; fake-gcs-server ignores GCS's
``ifGenerationMatch`` on TensorStore's uploads, so a ``gs://`` build there is refused by name.
"""

import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
import tensorstore as ts
from store_build_helpers import docs, slow_build

from meshbatch.cache import CacheWriter, TokenCache
from meshbatch.cache.builds import CacheWaitTimeout, build_once, store_lock
from meshbatch.cache.builds.store_build import LOCK_ENV, BuildLockLost
from meshbatch.cache.builds.store_lock import LEASE_ENV, ConditionalWritesUnsupported, StoreLock
from meshbatch.cache.builds.waiting import WAIT_ENV
from meshbatch.cache.format.arrays import CREATE_ATTEMPTS
from meshbatch.cache.format.checks import CacheIntegrityError
from meshbatch.cache.format.ledger import try_read_ledger
from meshbatch.cache.format.stores import kvstore_spec

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "store_build_worker.py")


def url(scheme: str = "s3") -> str:
    return f"{scheme}://meshbatch/{uuid.uuid4().hex}/cache/train"


def keys(path: str) -> list[str]:
    kv = ts.KvStore.open(kvstore_spec(path)).result()
    return sorted(k.decode() for k in kv.list().result())


def lock_exists(path: str) -> bool:
    parent, name = path.rsplit("/", 1)
    return f".{name}.build-lock" in keys(parent)


def rows_of(path: str) -> list[list[int]]:
    cache = TokenCache.open(path)
    return [r.tolist() for r in cache.read_rows(list(range(cache.num_rows)))]


def want() -> list[list[int]]:
    return [d.tolist() for d in docs()]


def clip(log: str, head: int = 3000, tail: int = 5000) -> str:
    """A worker's log for an assertion message: whole, or its start and end."""
    return (
        log
        if len(log) <= head + tail
        else f"{log[:head]}\n[... {len(log) - head - tail} chars ...]\n{log[-tail:]}"
    )


def until(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.02)


class Run(threading.Thread):
    """``build_once(path, build)`` in a thread: ``.result`` or ``.error`` once joined."""

    def __init__(self, path, build):
        super().__init__(daemon=True)
        self.path, self.build, self.result, self.error = path, build, None, None
        self.start()

    def run(self):
        try:
            self.result = build_once(self.path, self.build)
        except BaseException as error:
            self.error = error

    def outcome(self, timeout: float = 30.0):
        self.join(timeout)
        assert not self.is_alive(), f"build_once({self.path}) still running after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def runs():
    """``runs(path, build)`` starts a ``Run``; at the end (passed or failed) ``runs.gate`` opens
    and every run is joined (bounded), so no build outlives its test."""
    started: list[Run] = []

    class Runs:
        gate = threading.Event()

        def __call__(self, path, build) -> Run:
            started.append(Run(path, build))
            return started[-1]

    yield Runs()
    Runs.gate.set()
    for run in started:
        run.join(60)


def test_each_local_servers_conditional_writes(object_stores):
    StoreLock(url("s3")).check_conditional_writes()  # moto refuses a second create and a stale write
    with pytest.raises(ConditionalWritesUnsupported, match="ignores conditional writes"):
        StoreLock(url("gs")).check_conditional_writes()


def test_one_of_many_runs_creating_or_taking_over_the_lock_gets_it(object_stores):
    path = url()
    locks = [StoreLock(path, lease_s=0.3) for _ in range(8)]
    for lock in locks:
        lock.check_conditional_writes()
    barrier, won = threading.Barrier(8), []

    def take(lock):
        barrier.wait(10)
        if lock.take():
            won.append(lock)

    threads = [threading.Thread(target=take, args=(lock,)) for lock in locks]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert len(won) == 1 and won[0].holder is None  # the others read the winner's lock
    assert {lock.holder["owner"] for lock in locks if lock is not won[0]} == {won[0].owner}
    # the winner dies (never renews): every other sees the lease expire; of 7 takers, one wins
    takers = [lock for lock in locks if lock is not won[0]]
    until(lambda: all(lock.poll() == "expired" for lock in takers), "the lease expires")
    barrier, won = threading.Barrier(7), []
    threads = [threading.Thread(target=take, args=(lock,)) for lock in takers]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert len(won) == 1
    won[0].release()
    assert not lock_exists(path)


def test_a_held_lock_stays_live_over_leases_and_close_deletes_it(object_stores):
    path = url()
    holder, other = StoreLock(path, lease_s=0.6), StoreLock(path, lease_s=0.6)
    assert holder.take() and not other.take()
    holder.hold()  # renewed in a thread, as a quick-start build's lock would be
    try:
        states = set()
        for _ in range(18):  # 1.8 s: three leases
            time.sleep(0.1)
            states.add(other.poll())
        assert states == {"live"} and holder.lost is None
    finally:
        holder.close()
    assert other.poll() == "free" and not lock_exists(path)


def test_independent_runs_racing_for_one_s3_cache_build_it_once(object_stores, tmp_path):
    path = url()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(__file__)) + os.pathsep + env.get("PYTHONPATH", "")
    env[LEASE_ENV] = "5"  # longer than any pause of a loaded machine; the loser waits for the ledger
    out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    argv = [sys.executable, WORKER, path, str(tmp_path)]
    procs = [subprocess.Popen([*argv, str(i)], env=env, **out) for i in range(2)]
    try:
        until(lambda: all((tmp_path / f"ready-{i}").exists() for i in range(2)), "both runs start", 120)
        (tmp_path / "go").touch()
        logs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    codes = [p.returncode for p in procs]
    assert codes == [0, 0], "\n".join(
        f"== run {i} (exit {c}) ==\n{clip(log)}" for i, (c, log) in enumerate(zip(codes, logs, strict=True))
    )
    outs = [json.loads((tmp_path / f"out-{i}.json").read_text()) for i in range(2)]
    assert sorted(o["built"] for o in outs) == [False, True], logs  # exactly one build
    assert sorted(o["ours"] for o in outs) == [False, True]
    assert outs[0]["rows"] == outs[1]["rows"] == rows_of(path) == want()
    assert not lock_exists(path)


def test_a_live_lock_makes_the_second_run_wait_then_open_the_finished_cache(object_stores, monkeypatch, runs):
    monkeypatch.setenv(LEASE_ENV, "0.8")
    path, gate, first, second = url(), runs.gate, [], []
    a = runs(path, slow_build(docs(), first, pause=0.05, gate=gate))
    until(lambda: first and lock_exists(path), "the first run takes the lock")
    b = runs(path, slow_build(docs(), second, pause=0.05))
    time.sleep(2.0)  # 2.5 leases: the first run's renewals keep its lock live
    assert not second and b.is_alive()
    gate.set()
    assert a.outcome() is True and b.outcome() is False
    assert not second and rows_of(path) == want() and not lock_exists(path)


def test_an_expired_lock_is_taken_over_and_the_dead_builds_objects_removed(object_stores, monkeypatch):
    monkeypatch.setenv(LEASE_ENV, "0.3")
    path, built = url(), []
    dead = StoreLock(path)
    assert dead.take()  # a run killed while building: its lock stays, never renewed
    writer = CacheWriter(path)  # its objects: arrays, an unfinished ledger, another field's chunk
    writer.write(docs(seed=1)[:40])
    writer.flush()
    ts.KvStore.open(kvstore_spec(path)).result().write("attention_mask/data/c/0", b"dead's").result()
    assert not try_read_ledger(path).is_finished
    start = time.monotonic()
    assert build_once(path, slow_build(docs(), built, pause=0)) is True
    assert time.monotonic() - start >= 0.3  # it waited out the dead run's lease
    assert built == [path] and rows_of(path) == want() and try_read_ledger(path).is_finished
    assert not any(k.startswith("attention_mask/") for k in keys(path)) and not lock_exists(path)


def test_a_failed_build_releases_the_lock_and_a_waiting_run_builds(object_stores, monkeypatch, runs):
    monkeypatch.setenv(LEASE_ENV, "1")
    path, gate, second = url(), runs.gate, []

    def failing(target):
        with CacheWriter(target, if_exists="overwrite") as writer:
            writer.write(docs()[:20])
            writer.flush()  # committed, unfinished
            assert gate.wait(30)
            raise OSError("the source went away")

    a = runs(path, failing)
    until(lambda: lock_exists(path), "the first run takes the lock")
    b = runs(path, slow_build(docs(), second, pause=0))
    time.sleep(0.3)
    assert not second
    gate.set()
    with pytest.raises(OSError, match="went away"):
        a.outcome()
    assert b.outcome() is True and second == [path] and rows_of(path) == want()


def test_a_waiting_run_times_out_naming_the_holder(object_stores, monkeypatch, runs):
    monkeypatch.setenv(LEASE_ENV, "1")
    path, gate, first = url(), runs.gate, []
    a = runs(path, slow_build(docs(), first, pause=0, gate=gate))
    until(lambda: first and lock_exists(path), "the first run takes the lock")
    monkeypatch.setenv(WAIT_ENV, "0.5")
    second = []
    with pytest.raises(CacheWaitTimeout, match=r"build lock s3://.*\.train\.build-lock .*'owner'"):
        build_once(path, slow_build(docs(), second))
    gate.set()
    assert a.outcome() is True and not second


def test_a_build_whose_lock_was_taken_over_fails_loudly(object_stores, monkeypatch, runs):
    monkeypatch.setenv(LEASE_ENV, "0.3")
    path, gate, first = url(), runs.gate, []
    a = runs(path, slow_build(docs(), first, pause=0, gate=gate))
    until(lambda: first and lock_exists(path), "the first run takes the lock")
    parent, name = path.rsplit("/", 1)
    ts.KvStore.open(kvstore_spec(parent)).result().write(f".{name}.build-lock", b'{"owner": "x"}').result()
    time.sleep(0.3)  # a renewal finds the lock replaced
    gate.set()
    with pytest.raises(BuildLockLost, match="taken over while this run built it"):
        a.outcome()


def test_objects_that_are_not_a_cache_are_refused_not_deleted(object_stores):
    path, built = url(), []
    ts.KvStore.open(kvstore_spec(path)).result().write("notes.txt", b"mine").result()
    with pytest.raises(FileExistsError, match=r"not a cache's \(\['notes.txt'\]\)"):
        build_once(path, slow_build(docs(), built))
    assert not built and keys(path) == ["notes.txt"] and not lock_exists(path)


def test_a_store_ignoring_conditional_writes_is_refused_unless_unlocked(object_stores, monkeypatch):
    path, built = url("gs"), []
    with pytest.raises(ConditionalWritesUnsupported, match=f"cannot lock the build of {path}"):
        build_once(path, slow_build(docs(), built, pause=0))
    assert not built
    monkeypatch.setenv(LOCK_ENV, "off")  # the user's explicit choice: in place, unlocked
    assert build_once(path, slow_build(docs(), built, pause=0)) is True
    assert built == [path] and rows_of(path) == want()


def test_bad_lock_settings_are_refused_by_name(object_stores, monkeypatch):
    monkeypatch.setenv(LOCK_ENV, "maybe")
    with pytest.raises(ValueError, match="MESHBATCH_BUILD_LOCK='maybe'"):
        build_once(url(), slow_build(docs(), []))
    monkeypatch.setenv(LOCK_ENV, "on")
    for bad in ("0", "-1", "inf", "soon"):
        monkeypatch.setenv(LEASE_ENV, bad)
        with pytest.raises(ValueError, match=f"MESHBATCH_BUILD_LEASE_S={bad!r}"):
            build_once(url(), slow_build(docs(), []))


@pytest.fixture
def lossy_s3(object_stores, monkeypatch):
    """S3 through a proxy that can lose a reply (``LatencyProxy.lose_reply``): the store applies
    the request, the client never hears the answer and retries it."""
    from object_store import LatencyProxy

    proxy = LatencyProxy(object_stores["s3"].port, low=0.0, high=0.0)
    monkeypatch.setenv("MESHBATCH_S3_ENDPOINT", proxy.url)
    monkeypatch.setattr(store_lock, "_checked", {})  # probe this endpoint afresh
    try:
        yield proxy
    finally:
        proxy.stop()


def test_a_lost_reply_to_creating_a_field_is_retried_not_a_failed_build(lossy_s3, caplog):
    """TensorStore retries the *create only if absent* write of ``zarr.json`` whose reply was lost
    and its own first attempt refuses it (google/tensorstore#290: ``ALREADY_EXISTS``, a failed
    build, seen in CI under load). The open deletes what is there anyway: it is tried again."""
    path = url()
    lossy_s3.lose_reply("PUT", "input_ids/offsets/zarr.json")
    with caplog.at_level(logging.WARNING, logger="meshbatch.cache.format.arrays"):
        slow_build(docs(), [], pause=0.0)(path)
    assert len(lossy_s3.lost_replies) == 1 and "zarr.json" in lossy_s3.lost_replies[0]
    assert "ALREADY_EXISTS" in caplog.text and "attempt 1 of 3" in caplog.text
    assert rows_of(path) == want()


def test_creating_a_field_gives_up_after_its_attempts_naming_the_array(lossy_s3):
    lossy_s3.lose_reply("PUT", "input_ids/data/zarr.json", times=CREATE_ATTEMPTS)
    with pytest.raises(CacheIntegrityError, match=r"cannot create zarr array .*input_ids/data \(attempt 3\)"):
        CacheWriter(url(), if_exists="overwrite")
    assert len(lossy_s3.lost_replies) == CREATE_ATTEMPTS


@pytest.mark.parametrize("lost", ["probe", "take", "renew"])
def test_a_lost_reply_to_a_lock_write_is_read_back_as_ours(lossy_s3, lost):
    """A conditional write of the lock (or of the store's probe) whose reply was lost is retried
    and refused by itself; reading the key back finds exactly our bytes, so it was ours: the
    run takes its lock at once (not after waiting out its own lease), keeps it when renewing, and
    does not call the store one that ignores conditions."""
    path = url()
    holder, other = StoreLock(path, lease_s=30), StoreLock(path, lease_s=30)
    lossy_s3.lose_reply("PUT", {"probe": "build-lock.probe-", "take": "build-lock HTTP"}.get(lost, "x-never"))
    assert holder.take() and not other.take() and other.holder["owner"] == holder.owner
    if lost == "renew":
        lossy_s3.lose_reply("PUT", "build-lock HTTP")
        assert holder.renew() and holder.lost is None and other.poll() == "live"
        assert other.holder["renewal"] == holder._renewal  # the renewal the lost reply was for
    assert len(lossy_s3.lost_replies) == 1
    holder.release()
    assert not lock_exists(path)
