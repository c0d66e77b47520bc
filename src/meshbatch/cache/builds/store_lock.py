"""A lease lock for one build of a cache at an object-store URL, from TensorStore's conditional writes.

An object store has no rename and no ``flock``: two independent runs building ``gs://b/c/train`` in
place at once tear it. The lock is one small object beside the cache, ``gs://b/c/.train.build-lock``,
written only through TensorStore's conditional writes (``KvStore.write(key, value, if_equal=gen)``):

* taking a free lock writes it *only if it does not exist* (``if_equal`` = the no-value generation:
  ``ifGenerationMatch=0`` on GCS, ``If-None-Match: *`` on S3); of two runs, one write succeeds, the
  other gets the unknown generation (``b""``) back and reads the winner's lock (``_write_if``: a
  refused write whose reply was lost was ours);
* the holder rewrites it every ``lease_s / 4`` seconds against the generation it last wrote
  (``If-Match`` / ``ifGenerationMatch=<gen>``), and deletes it the same way when done;
* another run takes it over only once the generation it read has stayed the same for a whole lease
  *on the taker's own clock* (so clocks of different machines need not agree), by a conditional
  write against that generation: of two takers, one wins.

The value is JSON naming the holder and its lease (``owner``, ``host``, ``pid``, ``lease_s``,
``expires`` (the holder's wall clock, for people reading it), ``renewal``: a counter, so every
write has new bytes: S3's generation is the ETag, an MD5 of the bytes)::

    lock = StoreLock("s3://b/c/train", lease_s=60)
    lock.take()        # True: created (or taken over); False: another run's, see lock.holder
    lock.poll()        # "free" | "live" | "expired" (same generation seen for lease_s seconds)
    with lock.renewing():   # a thread rewrites it every 15 s; lock.lost says why it could not
        build()
    lock.release()     # deleted only if it is still the generation we wrote
    lock.hold(); ...; lock.close()   # the same, for a build in a thread (renew until close)

A store that ignores the conditions (fake-gcs-server v1.54.0 takes TensorStore's media uploads with
``ifGenerationMatch=0`` even when the object exists) cannot keep two builders apart: ``take`` first
checks, once per bucket and process, that a second create-if-absent and a write against a stale
generation are refused, and raises ``ConditionalWritesUnsupported`` naming the store otherwise.
On S3, TensorStore's conditional *delete* is a HEAD then a DELETE (S3 has no conditional delete):
``release`` runs it only after the renewal thread stopped, while the lease is live, so no other
run can have taken the lock in between.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid

import tensorstore as ts

from meshbatch.cache.builds.waiting import env_seconds
from meshbatch.cache.format.stores import kvstore_spec, shared_context, split_url

logger = logging.getLogger(__name__)
LEASE_ENV = "MESHBATCH_BUILD_LEASE_S"
DEFAULT_LEASE_S = 60.0
LOCK_SUFFIX = ".build-lock"
_checked: dict[str, bool] = {}  # store (spec without path) -> honours conditional writes
_checked_lock = threading.Lock()


class ConditionalWritesUnsupported(RuntimeError):
    """The object store ignored a conditional write, so the build lock cannot exclude anyone."""


def _no_value() -> bytes:
    """TensorStore's generation of a missing key (what ``if_equal`` takes for "only if absent")."""
    return ts.KvStore.open({"driver": "memory"}).result().read("k").result().stamp.generation


class StoreLock:
    """The build lock of the cache at ``path`` (``gs://`` or ``s3://``); see the module docstring."""

    def __init__(self, path: str, *, lease_s: float | None = None):
        scheme, bucket, key = split_url(path)
        if not key:
            raise ValueError(f"an object-store cache needs a path below its bucket (got path={path!r})")
        parent, name = posixpath.split(key)
        self.path, self.key = path, f".{name}{LOCK_SUFFIX}"
        self.url = f"{scheme}://{bucket}/{posixpath.join(parent, self.key)}"
        self.lease_s = env_seconds(LEASE_ENV, DEFAULT_LEASE_S) if lease_s is None else float(lease_s)
        self.owner = uuid.uuid4().hex
        spec = kvstore_spec(f"{scheme}://{bucket}/{parent}" if parent else f"{scheme}://{bucket}")
        self._store_id = json.dumps({k: v for k, v in spec.items() if k != "path"}, sort_keys=True)
        self._kv = ts.KvStore.open(spec, context=shared_context()).result()
        self._none = _no_value()
        self._gen: bytes | None = None  # the generation we wrote last (we hold the lock)
        self._seen: tuple[bytes, float] | None = None  # another's generation, first seen (monotonic)
        self.holder: dict | None = None  # the lock's value as last read
        self._renewal = 0
        self.lost: str | None = None  # why the lock stopped being ours while we held it
        self._renewer: tuple[threading.Event, threading.Thread] | None = None

    def _value(self) -> bytes:
        self._renewal += 1
        return json.dumps({
            "owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
            "lease_s": self.lease_s, "expires": time.time() + self.lease_s, "renewal": self._renewal,
        }).encode()  # fmt: skip

    def check_conditional_writes(self) -> None:
        """Raises ``ConditionalWritesUnsupported`` unless the store refuses a second
        create-if-absent and a write against a stale generation (checked once per store)."""
        with _checked_lock:
            honoured = _checked.get(self._store_id)
            if honoured is None:
                honoured = self._probe()
                _checked[self._store_id] = honoured
        if not honoured:
            raise ConditionalWritesUnsupported(
                f"cannot lock the build of {self.path}: the store ignores conditional writes (a write "
                f"'only if absent' to {self.url}.probe-* replaced an existing object), so two runs building "
                "it at once could not be kept apart. Build the cache once beforehand, or set "
                "MESHBATCH_BUILD_LOCK=off to build in place without a lock (runs racing can tear it)"
            )

    def _probe(self) -> bool:
        key = f"{self.key}.probe-{uuid.uuid4().hex}"
        try:
            first = self._write_if(key, b"1", self._none)
            again = self._write_if(key, b"2", self._none)
            second = self._write_if(key, b"3", first) if first else b""
            stale = self._write_if(key, b"4", first) if second else b"x"
            return bool(first) and not again and bool(second) and not stale
        finally:
            self._kv.write(key, None).result()

    def take(self) -> bool:
        """Creates the lock if it is free, or replaces the expired generation ``poll`` saw; returns
        whether it is ours now (else ``holder`` is the lock as read now)."""
        self.check_conditional_writes()
        expected = self._none if self._seen is None else self._seen[0]
        gen = self._write_if(self.key, self._value(), expected)
        if gen:
            self._gen, self._seen, self.lost = gen, None, None
            if expected != self._none:
                logger.warning("meshbatch: took over expired build lock %s (was %s)", self.url, self.holder)
            return True
        self.poll()
        return False

    def poll(self) -> str:
        """Reads the lock: ``"free"`` (no lock), ``"live"`` or ``"expired"`` (the same generation
        seen for longer than the holder's lease, on this process's clock)."""
        read = self._kv.read(self.key).result()
        if read.state != "value":
            self._seen, self.holder = None, None
            return "free"
        try:
            self.holder = json.loads(read.value)
        except ValueError:
            self.holder = {"unreadable": read.value[:80].decode(errors="replace")}
        gen, now = read.stamp.generation, time.monotonic()
        if self._seen is None or self._seen[0] != gen:
            self._seen = (gen, now)
        return "expired" if now - self._seen[1] > self._holder_lease() else "live"

    def _holder_lease(self) -> float:
        """The lease the holder wrote (ours where it wrote none that makes sense)."""
        try:
            lease = float(self.holder["lease_s"])  # type: ignore[index]
        except (TypeError, KeyError, ValueError):
            return self.lease_s
        return lease if 0 < lease < float("inf") else self.lease_s

    def watch_interval(self) -> float:
        """How long a waiter may go between two ``poll``s (half the holder's lease)."""
        return max(0.05, self._holder_lease() / 2)

    def renew(self) -> bool:
        """Rewrites our lock against our generation; False (and ``lost`` set) if it is not ours."""
        gen = self._write_if(self.key, self._value(), self._gen)
        if gen:
            self._gen = gen
            return True
        read = self._kv.read(self.key).result()
        self.lost = f"the lock {self.url} was replaced or deleted: now {read.value[:200]!r}"
        return False

    def _write_if(self, key: str, value: bytes, expected: bytes) -> bytes:
        """Writes ``value`` at ``key`` only if its generation is ``expected``: the new generation,
        or ``b""`` if refused. A refusal is read back: a conditional write whose reply was lost is
        retried by TensorStore and refused by its own first attempt (google/tensorstore#290), so
        ``key`` holding exactly ``value`` (every value written here is unique: owner and renewal
        counter, or a probe key of this process) means the write was ours."""
        gen = self._kv.write(key, value, if_equal=expected).result().generation
        if gen:
            return gen
        read = self._kv.read(key).result()
        return read.stamp.generation if read.state == "value" and read.value == value else b""

    def hold(self) -> StoreLock:
        """Starts a thread renewing the lock every ``lease_s / 4`` seconds, until ``close`` (or
        the end of ``renewing``); ``lost`` says why it stopped early."""
        if self._renewer is not None:
            return self
        stop = threading.Event()

        def loop() -> None:
            last_ok = time.monotonic()
            while not stop.wait(self.lease_s / 4):
                try:
                    if not self.renew():
                        logger.error("meshbatch: lost the build lock of %s: %s", self.path, self.lost)
                        return
                    last_ok = time.monotonic()
                except Exception as why:  # the store did not answer (after TensorStore's retries)
                    logger.warning("meshbatch: could not renew the build lock %s: %s", self.url, why)
                    if time.monotonic() - last_ok > self.lease_s:
                        self.lost = f"not renewed for {self.lease_s:g} s (the lease): {why}"
                        return

        thread = threading.Thread(target=loop, name="meshbatch-build-lock", daemon=False)
        self._renewer = (stop, thread)
        thread.start()
        return self

    def _stop_renewing(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer[0].set()
            renewer[1].join(timeout=self.lease_s + 60)

    @contextlib.contextmanager
    def renewing(self):
        """``hold`` while the block runs (the lock stays ours after it: ``release`` it)."""
        self.hold()
        try:
            yield self
        finally:
            self._stop_renewing()

    def close(self) -> None:
        """Stops renewing and releases the lock (what a quick-start build's lock file does on
        ``close``)."""
        self._stop_renewing()
        self.release()

    def release(self) -> None:
        """Deletes the lock if it is still the generation we wrote (else leaves it alone)."""
        if self._gen is None:
            return
        gen, self._gen = self._gen, None
        try:
            if not self._kv.write(self.key, None, if_equal=gen).result().generation:
                logger.warning("meshbatch: build lock %s was no longer ours; left it", self.url)
        except Exception as why:  # it expires by itself
            logger.warning("meshbatch: could not delete the build lock %s (it expires): %s", self.url, why)
