"""A quick-start build's news on a local path: a reader sees a build's ``cache_id`` only while that
build holds the lock, never a killed build's state beside a new build's lock, and a build that
ends unfinished leaves its error for the readers of that build (not of a later one)."""

import threading

from meshbatch.cache.builds import LocalNews, quick_start_lock, release, take_lock
from meshbatch.levanter.quick_start import QuickStartBuildError


def test_a_reader_never_pairs_a_new_lock_with_a_killed_builds_state(tmp_path):
    """A new build takes the lock and then writes its state; a reader looking in between would
    take the killed build's ``cache_id`` for the live build's. It waits for the new one instead."""
    path = str(tmp_path / "cache" / "train")
    take_lock(path, "killed").close()  # a killed build: its state stays, its lock is free
    assert LocalNews(path).cache_id() is None
    looked: list[str | None] = []
    reader = threading.Thread(target=lambda: looked.append(LocalNews(path).cache_id()), daemon=True)

    def acquire_then_let_a_reader_look(p):
        lock = quick_start_lock(p)
        reader.start()
        reader.join(timeout=1.0)  # without the state file's lock it would read "killed" now
        return lock

    lock = take_lock(path, "new", acquire_then_let_a_reader_look)
    reader.join(timeout=30)
    assert looked == ["new"]
    release(path, lock, "new", None)


def test_an_unfinished_build_leaves_its_error_for_its_own_readers(tmp_path):
    path = str(tmp_path / "cache" / "train")
    lock = take_lock(path, "first")
    news = LocalNews(path)
    news.accepted = news.cache_id()
    assert news.accepted == "first" and news.failure() is None
    assert take_lock(path, "second") is None  # held: another run reads this build
    release(path, lock, "first", QuickStartBuildError("the build was stopped"))
    assert news.failure() == "QuickStartBuildError: the build was stopped"
    assert LocalNews(path).cache_id() is None  # over: no live build
    later = take_lock(path, "third")  # a new run builds it again
    assert news.failure() == LocalNews.STOPPED  # the build this reader read is over, unfinished
    fresh = LocalNews(path)
    assert fresh.cache_id() == "third" and fresh.failure() is None
    release(path, later, "third", None)
