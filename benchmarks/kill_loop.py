"""Kill loop: SIGKILL cache writers at random instants, again and again; check what every kill left.

Each trial forks a writer from a zygote process (it imported meshbatch once, and never touched
TensorStore, so a trial costs milliseconds instead of an interpreter start), lets it run for a
random time and SIGKILLs it. The next writer resumes what the last one left, so one cache takes
many kills::

    consolidated  CacheWriter(p, if_exists="resume", flush_tokens=400), one row per write() call
    sharded       ShardedCacheWriter(p, if_exists="resume"): shards s0..s3, flush_tokens=400
    preblock-zarr preblock(p, [cache], block_size=64): rebuilt by the next run
    preblock-npy  the same with output_format="npy" (chunk*.npy files)

After every kill: the rows the ledger commits (for a sharded cache, the finished shards and the
committed rows of the shard being written) read back exactly and pass ``validate_cache(deep=True)``;
preblocked output opens with exactly the clean build's blocks or fails with a named error. When a
writer completes, its output must equal a clean build: the same ledger but for ``cache_id``, the
same checksum sidecar, the same offsets and data (every stored chunk decoded), and the same blocks.
Then a fresh output starts.

    python benchmarks/kill_loop.py           # 300 kills: 120, 120, 30, 30 -> kill_loop.json
    python benchmarks/kill_loop.py --quick   # 40 kills: 16, 16, 4, 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

FLUSH_TOKENS, ROWS, SHARDS, BLOCK_SIZE = 400, 1200, 4, 64
SHARES = {"consolidated": 0.4, "sharded": 0.4, "preblock-zarr": 0.1, "preblock-npy": 0.1}  # of the kills


def doc(i: int) -> np.ndarray:
    """Row ``i`` of every cache here: 0..49 tokens (empty rows included), deterministic."""
    return (np.arange(i % 50, dtype=np.int32) * 7 + i) % 30_000


def write(mode: str, path: str, source: str) -> None:
    """One writer run of ``mode`` at ``path``: resumes (or, for preblock, rebuilds) and completes."""
    from meshbatch.cache import CacheWriter, ShardedCacheWriter

    if mode == "consolidated":
        with CacheWriter(path, if_exists="resume", flush_tokens=FLUSH_TOKENS) as writer:
            for i in range(writer.num_rows, ROWS):
                writer.write([doc(i)])
    elif mode == "sharded":
        writer = ShardedCacheWriter(path, if_exists="resume")
        per = ROWS // SHARDS
        for j in range(SHARDS):
            rows = (doc(i) for i in range(j * per, (j + 1) * per))
            writer.write_shard(f"s{j}", rows, flush_tokens=FLUSH_TOKENS)
        writer.finish()
    else:
        from meshbatch.datasets.preblocked import preblock

        output_format = mode.removeprefix("preblock-")
        preblock(
            path,
            [source],
            block_size=BLOCK_SIZE,
            output_format=output_format,
            vocab_size=30_000,
            if_exists="overwrite",
        )


# -- checks --------------------------------------------------------------------------------------


def check_committed(mode: str, path: str, clean: str) -> int:
    """Checks what a kill left at ``path``; returns the committed rows (blocks) it verified."""
    from meshbatch.cache import TokenCache, validate_cache
    from meshbatch.cache.format.ledger import try_read_ledger

    if mode.startswith("preblock"):
        return _check_blocks(path, clean, complete=False)
    ledger = try_read_ledger(path)
    if ledger is None:
        return 0
    checked = 0
    if ledger.total_num_rows:
        _same_rows(TokenCache.open(path, require_finished=False), 0)
        report = validate_cache(path, require_finished=False, deep=True, progress=False)
        assert report.ok, report.format()
        checked = ledger.total_num_rows
    if mode == "sharded":
        current = os.path.join(path, f"s{len(ledger.finished_shards)}")
        shard = try_read_ledger(current) if len(ledger.finished_shards) < SHARDS else None
        if shard is not None and shard.total_num_rows:
            _same_rows(TokenCache.open(current, require_finished=False), ledger.total_num_rows)
            report = validate_cache(current, require_finished=False, deep=True, progress=False)
            assert report.ok, report.format()
            checked += shard.total_num_rows
    return checked


def _same_rows(cache, first: int) -> None:
    for i, row in enumerate(cache.read_rows(np.arange(cache.num_rows))):
        np.testing.assert_array_equal(row, doc(first + i), err_msg=f"{cache.path}: row {i}")


def _check_blocks(path: str, clean: str, *, complete: bool) -> int:
    """``path`` opens with ``clean``'s blocks, or (``complete=False``) fails with a named error."""
    from meshbatch.datasets.preblocked import open_blocks

    try:
        source = open_blocks(path)
    except (ValueError, FileNotFoundError) as e:
        if complete:
            raise
        assert str(e), "an unnamed error"
        return 0
    want = open_blocks(clean)
    assert (source.num_blocks, source.block_size) == (want.num_blocks, want.block_size), path
    every = np.arange(want.num_blocks)
    np.testing.assert_array_equal(source.read_blocks(every), want.read_blocks(every), err_msg=path)
    np.testing.assert_array_equal(source.real_tokens(), want.real_tokens(), err_msg=path)
    return want.num_blocks


def check_equal(mode: str, path: str, clean: str) -> None:
    """A completed output equals the clean build (see the module docstring)."""
    if mode.startswith("preblock"):
        _check_blocks(path, clean, complete=True)
        return
    _same_cache(path, clean)
    if mode == "sharded":
        for j in range(SHARDS):
            _same_cache(os.path.join(path, f"s{j}"), os.path.join(clean, f"s{j}"))


def _same_cache(path: str, clean: str) -> None:
    from meshbatch.cache.format.arrays import DEFAULT_CHUNK_SIZE, open_field
    from meshbatch.cache.format.ledger import read_ledger
    from meshbatch.cache.integrity.checksums import SIDECAR_FILE_NAME

    got, want = (read_ledger(p).to_dict() for p in (path, clean))
    got.pop("cache_id"), want.pop("cache_id")
    assert got == want, f"{path}: ledger {got} != clean {want}"
    if want.get("layout") == "sharded":
        return
    for name in ("input_ids/" + SIDECAR_FILE_NAME, "input_ids/offsets/zarr.json", "input_ids/data/zarr.json"):
        with open(os.path.join(path, name)) as a, open(os.path.join(clean, name)) as b:
            assert json.load(a) == json.load(b), f"{path}/{name} differs from the clean build's"
    a, b = open_field(path, "input_ids"), open_field(clean, "input_ids")
    size = DEFAULT_CHUNK_SIZE
    for array, other, used in ((a.offsets, b.offsets, want["total_num_rows"] + 1), (a.data, b.data, None)):
        stop = used if used is not None else want["field_counts"]["input_ids"]
        stop = -(-stop // size) * size  # every stored chunk, decoded, up to the clean build's extent
        np.testing.assert_array_equal(
            array[:stop].read().result(), other[:stop].read().result(), err_msg=path
        )


# -- the zygote ----------------------------------------------------------------------------------


def zygote() -> None:
    """Forks writers on request: ``{"mode", "path", "source"}`` -> pid; ``{"wait": pid}`` -> status."""
    import meshbatch.cache  # the slow imports, once
    import meshbatch.datasets.preblocked  # noqa: F401

    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        if "wait" in job:
            _, status = os.waitpid(job["wait"], 0)
            print(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status), flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                write(job["mode"], job["path"], job["source"])
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        print(pid, flush=True)


class Zygote:
    """The zygote subprocess (see ``zygote``); every answer is awaited at most ``timeout`` seconds."""

    def __init__(self, timeout: float = 120.0):
        self.timeout = timeout
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._answer() == "ready"

    def _answer(self) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        if not ready:
            raise TimeoutError(f"the kill-loop zygote did not answer in {self.timeout} s")
        return self.proc.stdout.readline().strip()

    def ask(self, request: dict) -> int:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return int(self._answer())

    def run(self, job: dict) -> float:
        """Runs ``job`` in a forked writer to completion; returns its seconds."""
        start = time.perf_counter()
        status = self.ask(job)
        if self.ask({"wait": status}) != 0:
            raise RuntimeError(f"the writer of {job} failed (traceback above)")
        return time.perf_counter() - start

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the loop ------------------------------------------------------------------------------------


def kill_loop(root: str, *, kills: dict[str, int], seed: int = 0, max_delay: float = 0.6) -> dict:
    """``kills[mode]`` SIGKILLs per mode at instants uniform in ``[0, max_delay)`` s after each fork
    (a cache writer resumes, so its output moves on kill after kill), or, for ``preblock``, which
    starts over every time, in ``[0, 1.2 x)`` the time a clean build took.

    Returns per mode: kills, completed runs (each checked equal to a clean build), committed rows
    (blocks) verified after kills, and ``problems`` (every failed check, as text; none expected).
    """
    rng = random.Random(seed)
    zyg = Zygote()
    results = {}
    try:
        source = os.path.join(root, "source")
        if any(m.startswith("preblock") for m in kills):
            zyg.run({"mode": "consolidated", "path": source, "source": ""})
        for mode, wanted in kills.items():
            clean = os.path.join(root, f"{mode}-clean")
            seconds = zyg.run({"mode": mode, "path": clean, "source": source})  # a writer never killed
            cap = 1.2 * seconds if mode.startswith("preblock") else max_delay
            stats = {"kills": 0, "completed": 0, "committed_checked": 0, "seconds": 0.0, "problems": []}
            generation, start = 0, time.perf_counter()
            path = os.path.join(root, f"{mode}-{generation}")
            for _ in range(4 * wanted + 10):  # bounded: a writer may finish before its kill
                if stats["kills"] == wanted:
                    break
                pid = zyg.ask({"mode": mode, "path": path, "source": source})
                time.sleep(rng.uniform(0.0, cap))
                os.kill(pid, signal.SIGKILL)  # a child that already exited is a zombie: no error
                status = zyg.ask({"wait": pid})
                try:
                    if status == 0:
                        check_equal(mode, path, clean)
                        stats["completed"] += 1
                    elif status == -signal.SIGKILL:
                        stats["kills"] += 1
                        stats["committed_checked"] += check_committed(mode, path, clean)
                    else:
                        raise AssertionError(f"the writer failed (exit status {status}; traceback above)")
                except Exception as e:  # every failed check is reported, and the output rebuilt
                    stats["problems"].append(f"{mode} kill {stats['kills']}: {type(e).__name__}: {e}"[:2000])
                    status = 0
                if status == 0:
                    shutil.rmtree(path)
                    generation += 1
                    path = os.path.join(root, f"{mode}-{generation}")
            if os.path.exists(path):  # the last output, finished without a kill
                try:
                    write(mode, path, source)
                    check_equal(mode, path, clean)
                    stats["completed"] += 1
                except Exception as e:
                    stats["problems"].append(f"{mode} final run: {type(e).__name__}: {e}"[:2000])
            stats["seconds"] = round(time.perf_counter() - start, 2)
            results[mode] = stats
    finally:
        zyg.close()
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 kills instead of 300")
    parser.add_argument("--kills", type=int, help="kills in all (default 300, 40 with --quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay", type=float, default=0.6, help="kill instants in [0, this) seconds")
    args = parser.parse_args(argv)
    from harness import banner, write_json

    kills = args.kills or (40 if args.quick else 300)
    plan = {mode: round(kills * share) for mode, share in SHARES.items()}
    payload = banner(f"kill loop: {sum(plan.values())} SIGKILLs {plan}")
    with tempfile.TemporaryDirectory() as root:
        results = kill_loop(root, kills=plan, seed=args.seed, max_delay=args.max_delay)
    payload.update(kills=plan, seed=args.seed, max_delay=args.max_delay, results=results)
    for mode, r in results.items():
        print(
            f"{mode:14s} kills {r['kills']:4d}  completed {r['completed']:3d}  committed rows checked "
            f"{r['committed_checked']:7d}  problems {len(r['problems'])}  {r['seconds']:.1f} s"
        )
        for p in r["problems"]:
            print("   ", p)
    write_json(__file__, payload)
    return payload


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote()
    else:
        main()
