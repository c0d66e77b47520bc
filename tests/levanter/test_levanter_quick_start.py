"""Quick start builds Levanter's cache: the same tokens (BOS/EOS by Levanter's processor, with and
without ``enforce_eos``), ledger metadata and fields as ``cache_builder: in_process``, from
Levanter's shard source (brace-expanded ``.gz`` URLs); a build failing after its first commit
stops the consumer's wait with the cause, instead of hanging."""

import gc
import gzip
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import haliax as hax
import jax
import numpy as np
import pytest
from levanter.store.cache import CacheOptions, TreeCache
from threads import error_within

from meshbatch.cache import ByteTokenizer, CacheWaitTimeout, TokenCache
from meshbatch.cache.builds import quick_start_running
from meshbatch.cache.format.ledger import Ledger, LedgerFile, try_read_ledger, write_ledger
from meshbatch.levanter import CausalLMConfig, MeshbatchDataset, PipelineLoader, quick_start
from meshbatch.levanter.quick_start import QuickStartBuildError, growing_cache


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Documents, and a byte tokenizer that adds no EOS itself and names a BOS (id 256)."""
    root = tmp_path_factory.mktemp("quick")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "délta", "epsilon", "zeta"]
    texts = [" ".join(rng.choice(words, n)) for n in rng.integers(1, 60, 300)]
    lines = [json.dumps({"text": t}) + "\n" for t in texts]
    (root / "docs.jsonl").write_text("".join(lines))
    for part, chunk in ((1, lines[:170]), (2, lines[170:])):
        with gzip.open(root / f"part.{part}.jsonl.gz", "wt") as f:
            f.writelines(chunk)
    tok = ByteTokenizer(add_eos=False).save_pretrained(str(root / "tok"))
    config = json.loads((root / "tok" / "tokenizer_config.json").read_text())
    (root / "tok" / "tokenizer_config.json").write_text(json.dumps(config | {"bos_token": "<eos>"}))
    assert tok
    return root


def config(root, name, urls, **fields):
    return CausalLMConfig(tokenizer=str(root / "tok"), cache_dir=str(root / name), train_urls=urls,
                          shuffle="era", era_length=4, **fields)  # fmt: skip


def finished(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not getattr(try_read_ledger(path), "is_finished", False):
        assert time.monotonic() < deadline, f"{path} did not finish"
        time.sleep(0.05)
    return TokenCache.open(path)


def rows(cache):
    return cache.read_rows(np.arange(cache.num_rows))


@pytest.mark.parametrize("enforce_eos", [True, False])
def test_quick_start_writes_levanters_cache(root, enforce_eos):
    docs = [str(root / "docs.jsonl")]
    levanter = config(root, f"built-{enforce_eos}", docs, enforce_eos=enforce_eos)
    want_path = levanter.build_split(levanter, "train", levanter.cache_dir)
    quick = config(root, f"quick-{enforce_eos}", docs, enforce_eos=enforce_eos, quick_start=True)
    growing_cache(quick, quick.cache_dir)
    got_path = os.path.join(quick.cache_dir, "train")
    got, want = rows(finished(got_path)), rows(TokenCache.open(want_path))
    assert len(got) == len(want) == 300
    assert all(row[0] == 256 for row in got)  # Levanter's BOS
    assert all((row[-1] == 256) == enforce_eos for row in got)  # EOS only where Levanter adds it
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert try_read_ledger(got_path).metadata == try_read_ledger(want_path).metadata
    processor_exemplar = {"input_ids": np.zeros(0, np.int32), "token_type_ids": np.zeros(0, np.int32)}
    levanters = TreeCache.load(got_path, processor_exemplar)  # Levanter reads it, every field
    assert len(levanters.as_sync_dataset()) == 300


def test_quick_start_reads_brace_expanded_gzip_urls(root):
    quick = config(root, "braces", [str(root / "part.{1..2}.jsonl.gz")], quick_start=True)
    growing_cache(quick, quick.cache_dir)
    plain = config(root, "plain", [str(root / "docs.jsonl")])
    got = rows(finished(os.path.join(quick.cache_dir, "train")))
    want = rows(TokenCache.open(plain.build_split(plain, "train", plain.cache_dir)))
    assert len(got) == 300
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_quick_start_refuses_the_ray_builder(root):
    quick = config(root, "ray", [str(root / "docs.jsonl")], quick_start=True, cache_builder="ray")
    with pytest.raises(ValueError, match="cache_builder='ray'"):
        growing_cache(quick, quick.cache_dir)


def test_a_build_failing_after_its_first_commit_stops_the_consumer(root):
    """300 good documents (3 batches of 128, the first one committed), then a line that is not JSON."""
    (root / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    quick = config(root, "failing", [str(root / "docs.jsonl"), str(root / "bad.jsonl")], quick_start=True)
    Pos = hax.Axis("position", 16)
    dataset = MeshbatchDataset(quick.dataset(Pos.size), Pos=Pos, key=jax.random.key(0), epochs=None)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))

    def consume():
        loader = PipelineLoader(dataset, mesh=mesh, axis_mapping={"batch": "data"}, batch_size=8)
        for _ in loader.iter_from_step(0):
            pass

    raised = error_within(consume, 60, "the consumer still waits for rows the failed build never writes")
    error = raised
    while not isinstance(error, QuickStartBuildError) and error.__cause__ is not None:
        error = error.__cause__
    assert isinstance(error, QuickStartBuildError), repr(raised)
    assert try_read_ledger(os.path.join(quick.cache_dir, "train")).total_num_rows >= 128  # it committed
    assert "failing/train failed" in str(error) and "JSONDecodeError" in str(error), str(error)
    assert f"from shard '{root / 'bad.jsonl'}' after 300 documents" in str(error), str(error)


def test_a_cache_of_another_processor_is_named_when_reused(root, caplog):
    docs = [str(root / "docs.jsonl")]
    eos = config(root, "meta", docs, enforce_eos=True)
    eos.build_split(eos, "train", eos.cache_dir)
    caplog.clear()
    with caplog.at_level("WARNING", logger="meshbatch.levanter.caches"):
        no_eos = config(root, "meta", docs, enforce_eos=False)
        no_eos.build_split(no_eos, "train", no_eos.cache_dir)
        growing_cache(config(root, "meta", docs, enforce_eos=False, quick_start=True), no_eos.cache_dir)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and all(
        "meta/train was built with preprocessor_metadata" in w for w in warnings
    )
    assert "'append_eos': True" in warnings[0] and "'append_eos': False" in warnings[0]


def builders():
    return [t for t in threading.enumerate() if t.name == "meshbatch-build"]


def unfinish(path):
    """What a build killed after a commit leaves: an unfinished ledger over the arrays."""
    ledger = try_read_ledger(path)
    write_ledger(path, Ledger(ledger.total_num_rows, ledger.shard_rows, False, (),
                              metadata=ledger.metadata, cache_id=ledger.cache_id))  # fmt: skip


def test_a_restart_over_a_killed_builds_leftover_reads_only_its_own_build(root):
    """The stale unfinished ledger is gone before the builder starts, and the wait takes only the
    new build's ledger: never the leftover's arrays while the builder recreates them (this raced)."""
    quick = config(root, "restart", [str(root / "docs.jsonl")], quick_start=True)
    path = os.path.join(quick.cache_dir, "train")
    growing_cache(quick, quick.cache_dir)
    want = rows(finished(path))
    for _ in range(4):  # the race hit about half the restarts
        unfinish(path)
        stale = try_read_ledger(path).cache_id
        cache = growing_cache(quick, quick.cache_dir)
        assert cache.num_rows >= 128
        finished(path)
        assert cache.refresh() == 300 and try_read_ledger(path).cache_id != stale
        for a, b in zip(rows(cache), want, strict=True):
            np.testing.assert_array_equal(a, b)
        for thread in builders():
            thread.join(timeout=30)


def test_a_cache_published_while_taking_the_lock_is_opened_not_rebuilt(root, monkeypatch):
    """Another run publishes its finished cache between quick start's first look and its lock."""
    docs = [str(root / "docs.jsonl")]
    other = config(root, "recheck", docs)
    path = os.path.join(other.cache_dir, "train")
    opened: list[TokenCache] = []
    real_lock = quick_start.quick_start_lock

    def lock_after_another_run_published(p):
        other.build_split(other, "train", other.cache_dir)
        opened.append(TokenCache.open(path))  # that run trains from it
        return real_lock(p)

    monkeypatch.setattr(quick_start, "quick_start_lock", lock_after_another_run_published)
    cache = growing_cache(config(root, "recheck", docs, quick_start=True), other.cache_dir)
    published = try_read_ledger(path)
    assert published.is_finished and cache.is_finished and not builders()
    time.sleep(0.3)  # a rebuild would have rewritten the ledger by now
    assert try_read_ledger(path) == published
    assert opened[0].refresh() == 300 and not quick_start_running(path)


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory):
    """Enough documents, written one per batch, that a whole build takes far longer than a test."""
    root = tmp_path_factory.mktemp("long")
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(20_000)))
    return root


def test_closing_the_cache_stops_the_background_build_unfinished(root, long_corpus):
    quick = config(root, "closed", [str(long_corpus / "docs.jsonl")], quick_start=True,
                   cache_options=CacheOptions(batch_size=1))  # fmt: skip
    path = os.path.join(quick.cache_dir, "train")
    cache = growing_cache(quick, quick.cache_dir)
    start = time.monotonic()
    cache.close()
    assert not builders() and time.monotonic() - start < 10
    ledger = try_read_ledger(path)
    assert not ledger.is_finished and ledger.total_num_rows < 20_000
    with pytest.raises(QuickStartBuildError, match="stopped"):
        cache.refresh()
    assert not quick_start_running(path)  # the lock went with the builder


def test_a_process_whose_consumer_fails_ends_without_finishing_the_build(root, long_corpus, tmp_path):
    """The builder is stopped between batches as the interpreter ends (it used to tokenize the
    whole corpus first); the cache stays unfinished for a later run to build again."""
    cache_dir = tmp_path / "cache"
    script = textwrap.dedent(f"""
        from levanter.store.cache import CacheOptions
        from meshbatch.levanter import CausalLMConfig
        from meshbatch.levanter.quick_start import growing_cache
        cfg = CausalLMConfig(tokenizer={str(root / "tok")!r}, cache_dir={str(cache_dir)!r},
                             train_urls=[{str(long_corpus / "docs.jsonl")!r}], shuffle="era",
                             era_length=4, quick_start=True, cache_options=CacheOptions(batch_size=1))
        growing_cache(cfg, cfg.cache_dir)
        raise RuntimeError("training step failed")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "training step failed" in done.stderr, done.stderr[-2000:]
    ledger = try_read_ledger(str(cache_dir / "train"))
    assert not ledger.is_finished and ledger.total_num_rows < 20_000


def test_a_reader_waiting_for_a_first_commit_backs_off_and_is_bounded(root, monkeypatch):
    """Another run holds the lock and commits nothing: the reader reads the ledger with a backoff
    (20 ms doubling to 1 s: 9 reads in 2 s), not every 20 ms (about 100), and raises
    ``CacheWaitTimeout`` naming the cache and the bound."""
    quick = config(root, "stalled", [str(root / "docs.jsonl")], quick_start=True)
    path = os.path.join(quick.cache_dir, "train")
    held = quick_start.quick_start_lock(path)  # a run that took the lock and has committed nothing
    reads: list[float] = []
    real_read = LedgerFile.read

    def counted(self):
        if os.path.abspath(self.root) == path:
            reads.append(time.monotonic())
        return real_read(self)

    monkeypatch.setattr(LedgerFile, "read", counted)
    monkeypatch.setenv("MESHBATCH_CACHE_WAIT_S", "2")
    try:
        with pytest.raises(CacheWaitTimeout, match=rf"cache {path} .*MESHBATCH_CACHE_WAIT_S=2"):
            growing_cache(quick, quick.cache_dir)
    finally:
        held.close()
    assert 3 <= len(reads) <= 14, f"{len(reads)} ledger reads in a 2 s wait"


def test_a_finished_build_leaves_nothing_behind_in_the_process(root, monkeypatch):
    """Nothing keeps a builder once its build is over (an exit hook per build kept each one)."""
    started = []  # the builder, recorded as it starts (it may finish before growing_cache returns)

    class Recorded(threading.Thread):
        def start(self):
            if self.name == "meshbatch-build":
                started.append(self)
            super().start()

    monkeypatch.setattr(threading, "Thread", Recorded)
    quick = config(root, "freed", [str(root / "docs.jsonl")], quick_start=True)
    cache = growing_cache(quick, quick.cache_dir)
    (thread,) = started
    started.clear()
    thread.join(timeout=60)
    assert cache.refresh() == 300 and cache.is_finished
    gone = weakref.ref(thread)
    del thread, cache
    gc.collect()
    assert gone() is None, gc.get_referrers(gone())
