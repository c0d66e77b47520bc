"""Several processes asking for one cache get one valid cache: in a ``jax.distributed`` run only
process 0 builds (the others wait for its finished ledger), and independent runs racing on a
local path each build a hidden copy and rename it into place (the loser uses the winner's). With
``quick_start`` one process (process 0, or the run holding the path's lock) grows the cache in
place and the others read it as it grows."""

import json
import os

import numpy as np
import pytest
from levanter.data.text import TextLmDatasetFormat, preprocessor_for_format
from mp_harness import free_port, run_workers

from meshbatch.cache import ByteTokenizer, CacheWriter, TokenCache
from meshbatch.cache.builds import (
    CacheWaitTimeout,
    build_once,
    lock_path,
    quick_start_lock,
    quick_start_running,
    wait_for_finished,
    wait_seconds,
)
from meshbatch.cache.builds.waiting import WAIT_ENV
from meshbatch.cache.format.ledger import Ledger, try_read_ledger, write_ledger
from meshbatch.levanter import CausalLMConfig

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "levanter_cache_worker.py")
DOCS = 1000


def corpus(root):
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    texts = [" ".join(rng.choice(words, n)) for n in rng.integers(5, 200, DOCS)]
    with open(root / "docs.jsonl", "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    (root / "bad.jsonl").write_text('{"text": not json}\n')
    (root / "long.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(20_000)))
    leftover = CacheWriter(str(root / "quick" / "train"))  # a killed quick-start build's rows
    leftover.write([np.arange(5, 9, dtype=np.int32)] * 40)
    leftover.flush()
    ByteTokenizer().save_pretrained(str(root / "tok"))
    return texts


def expected(root, texts):
    config = CausalLMConfig(tokenizer=str(root / "tok"), cache_dir=str(root / "cache"))
    processor = preprocessor_for_format(TextLmDatasetFormat(), config.the_tokenizer, enforce_eos=True)
    return [np.asarray(row["input_ids"]) for row in processor([{"text": t} for t in texts])]


def build_in_processes(root, mode, processes=2):
    port = str(free_port())
    argvs = [[mode, str(i), str(processes), port, str(root)] for i in range(processes)]
    logs = run_workers(WORKER, argvs, timeout=120)
    return [dict(np.load(root / f"out-{i}.npz")) for i in range(processes)], logs


@pytest.mark.parametrize("mode", ["dist", "solo"])
def test_processes_building_one_cache_get_one_valid_cache(tmp_path, mode):
    texts = corpus(tmp_path)
    want = expected(tmp_path, texts)
    outs, logs = build_in_processes(tmp_path, mode)
    cache = TokenCache.open(str(tmp_path / "cache" / "train"))
    assert cache.num_rows == DOCS
    np.testing.assert_array_equal(cache.doc_lengths(), [len(w) for w in want])
    for out in outs:  # every process read the same, right, tokens
        np.testing.assert_array_equal(out["lengths"], [len(w) for w in want])
        np.testing.assert_array_equal(out["tokens"], np.concatenate(want))
        np.testing.assert_array_equal(out["quick_tokens"], np.concatenate(want))
    assert sorted(os.listdir(tmp_path / "cache")) == ["train"]  # no hidden copy left behind
    assert TokenCache.open(str(tmp_path / "quick" / "train")).num_rows == DOCS
    assert not outs[0]["opened_early"].any(), "process 1 opened the killed build's leftover rows"
    stopped = str(outs[1]["stop_error"])  # process 0 stopped its build: process 1 raised its error
    assert stopped.startswith("QuickStartBuildError True: ") and "the build was stopped" in stopped, stopped
    if mode == "dist":
        assert "waits for process 0 to build" in logs[1]
        assert "being built in the background" in logs[0] and "being built" not in logs[1]
        failures = [json.loads(str(out["failures"]))["bad"] for out in outs]
        assert failures[0].startswith("JSONDecodeError") and "bad.jsonl" in failures[0], failures[0]
        assert failures[1].startswith("CacheBuildFailed: process 0 failed to build cache"), failures[1]
        assert "JSONDecodeError" in failures[1] and "bad.jsonl" in failures[1], failures[1]


def test_an_unfinished_leftover_is_replaced_and_a_finished_cache_wins(tmp_path):
    texts = corpus(tmp_path)
    path = tmp_path / "cache" / "train"
    (path / "input_ids").mkdir(parents=True)  # a killed build: arrays begun, no ledger
    config = CausalLMConfig(tokenizer=str(tmp_path / "tok"), cache_dir=str(tmp_path / "cache"),
                            train_urls=[str(tmp_path / "docs.jsonl")])  # fmt: skip
    assert config.build_split(config, "train", config.cache_dir) == str(path)
    assert TokenCache.open(str(path)).num_rows == len(texts)
    finished = try_read_ledger(str(path))

    def loser(target):  # a racing run whose copy arrives second
        os.makedirs(os.path.join(target, "input_ids"))

    assert build_once(str(path), loser) is False
    assert try_read_ledger(str(path)) == finished
    assert sorted(os.listdir(tmp_path / "cache")) == ["train"]


def test_what_is_not_a_cache_is_never_deleted(tmp_path):
    """A user's directory at the cache's path is refused by name and left as it was; nothing of
    the build stays behind."""
    path = tmp_path / "data" / "train"
    path.mkdir(parents=True)
    (path / "my_corpus.jsonl").write_text('{"text": "precious"}\n')
    (path / "input_ids").mkdir()

    def build(target):
        os.makedirs(os.path.join(target, "input_ids"))
        write_ledger(target, Ledger(1, {"": 1}, True, ("",)))

    with pytest.raises(FileExistsError, match=rf"{path}: it exists and is not a cache.*my_corpus.jsonl"):
        build_once(str(path), build)
    assert sorted(os.listdir(path)) == ["input_ids", "my_corpus.jsonl"]
    assert sorted(os.listdir(path.parent)) == ["train"]


def test_a_file_url_locks_beside_the_cache(tmp_path, monkeypatch):
    """``file://`` paths are local paths: the quick-start lock is the cache's hidden sibling, not a
    ``file:`` folder under the working directory."""
    monkeypatch.chdir(tmp_path)
    url = f"file://{tmp_path}/cache/train"
    assert lock_path(url) == str(tmp_path / "cache" / ".train.quick-start.lock")
    held = quick_start_lock(url)
    assert held is not None and quick_start_running(str(tmp_path / "cache" / "train"))  # one lock
    held.close()
    assert not quick_start_running(url) and not (tmp_path / "file:").exists()


def test_the_copies_of_killed_builds_are_removed_and_live_ones_kept(tmp_path):
    """A killed build leaves its hidden copy and a free lock; the next build removes both. A live
    build's copy (its lock held) stays."""
    import fcntl

    parent = tmp_path / "cache"
    (parent / ".train.building-dead" / "input_ids").mkdir(parents=True)
    (parent / ".train.building-dead.lock").write_text("")
    (parent / ".train.building-live" / "input_ids").mkdir(parents=True)
    live = open(parent / ".train.building-live.lock", "w")
    fcntl.flock(live.fileno(), fcntl.LOCK_EX)

    def build(target):
        os.makedirs(os.path.join(target, "input_ids"))
        write_ledger(target, Ledger(1, {"": 1}, True, ("",)))

    assert build_once(str(parent / "train"), build) is True
    live.close()
    assert sorted(os.listdir(parent)) == [".train.building-live", ".train.building-live.lock", "train"]


def test_a_wait_is_bounded_and_names_the_bound(tmp_path, monkeypatch):
    with pytest.raises(CacheWaitTimeout, match=rf"{tmp_path}/nothing is not finished.*{WAIT_ENV}=0.2"):
        wait_for_finished(str(tmp_path / "nothing"), timeout=0.2)
    monkeypatch.setenv(WAIT_ENV, "soon")
    with pytest.raises(ValueError, match=f"{WAIT_ENV}='soon'"):
        wait_seconds()
    monkeypatch.setenv(WAIT_ENV, "0.3")
    assert wait_seconds() == 0.3
