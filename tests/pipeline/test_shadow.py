"""The shadow rule: producers start host work while the consumer is away, never when it may ask."""

import time

import pytest

from meshbatch.pipeline.prefetch import Prefetcher, Shadow, host_work_done, wait_turn


def _shadow(takes, asks, **kwargs) -> Shadow:
    shadow = Shadow(**kwargs)
    shadow.took(takes[0])
    for ask, take in zip(asks, takes[1:], strict=True):
        shadow.asked(ask)
        shadow.took(take)
    return shadow


def test_the_window_of_the_module_docstring():
    """Takes at 0, 0.31, 0.52, asks at 0.30, 0.50: away 0.30 and 0.19."""
    shadow = _shadow([0.0, 0.31, 0.52], [0.30, 0.50], min_steps=2)
    assert shadow.wait_s(0.525) == pytest.approx(0.014)  # just after a take: the consumer's
    assert shadow.wait_s(0.54) == 0.0  # the window [0.539, 0.691]
    assert shadow.wait_s(0.60) == 0.0
    assert shadow.wait_s(0.70) == pytest.approx(0.15)  # it may ask any time now: at most until 0.85
    assert shadow.wait_s(0.86) == 0.0  # later than it ever was: it pauses, work goes on


def test_the_window_closes_early_enough_for_the_measured_host_work():
    """The docstring's example with pieces of 50 ms: the last start is 0.52 + 0.171 - 0.05; with
    pieces longer than the window, it still stays open for [0.1, 0.2] of the shortest time away."""
    shadow = _shadow([0.0, 0.31, 0.52], [0.30, 0.50], min_steps=2)
    assert shadow.wait_s(0.66) == 0.0  # no piece measured: the whole window
    shadow.record_work(0.05)
    assert shadow.wait_s(0.64) == 0.0
    assert shadow.wait_s(0.645) == pytest.approx(0.52 + 0.33 - 0.645)  # too late to fit: held
    shadow.record_work(10.0)  # the longest recent piece counts
    assert shadow.wait_s(0.555) == 0.0  # 0.52 + [0.019, 0.038]
    assert shadow.wait_s(0.56) > 0


def test_pieces_of_host_work_after_the_reads_are_measured():
    """A producer's host work after its reads (``wait_turn`` there) is timed into the rule."""

    def produce(step):
        wait_turn()  # as fetch does once a step's reads are in
        time.sleep(0.004)
        return step

    with Prefetcher(produce, depth=2, workers=1) as stream:
        assert [next(stream) for _ in range(4)] == [0, 1, 2, 3]
        pieces = list(stream._workers.shadow.work)
    assert len(pieces) >= 4 and min(pieces) >= 0.004


def test_nothing_is_held_back_before_measurements_or_while_the_consumer_waits():
    shadow = _shadow([0.0, 0.31, 0.52], [0.30, 0.50])  # 2 times away < min_steps=4
    assert shadow.wait_s(0.70) == 0.0
    shadow = _shadow([0.0, 0.2, 0.4, 0.6, 0.8], [0.19, 0.39, 0.59, 0.79])
    assert shadow.wait_s(0.98) > 0  # past the window: held
    shadow.asked(0.99)
    shadow.waiting = True  # the consumer waits in next(): its batch must be made now
    assert shadow.wait_s(0.99) == 0.0
    shadow.took(1.0)
    assert shadow.wait_s(1.0) > 0  # just taken: held again
    assert wait_turn() is None  # outside a stream's producer thread: never held


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_bad_fraction(fraction):
    with pytest.raises(ValueError, match=f"fraction={fraction}"):
        Shadow(fraction=fraction)


def test_a_slow_consumer_holds_producers_back_and_gets_every_batch_in_order():
    """30 ms away per step, 2 ms to make one: the worker woken by a take waits 3 ms for its turn."""

    def produce(step):
        time.sleep(0.002)
        return step

    with Prefetcher(produce, depth=2, workers=2) as stream:
        got = []
        for _ in range(20):
            got.append(next(stream))
            time.sleep(0.03)
        stats = stream.stats()
    assert got == list(range(20))
    assert stats["held_count"] > 0 and stats["held_total_s"] > 0


def test_a_producer_slower_than_the_consumer_is_never_held_while_it_waits():
    """60 ms to make a step, 10 ms away: the consumer waits for every batch; nothing deadlocks."""

    def produce(step):
        time.sleep(0.06)
        return step

    with Prefetcher(produce, depth=1, workers=1) as stream:
        assert [next(stream) for _ in range(12)] == list(range(12))


def test_closing_releases_a_held_producer_at_once():
    """Away 20 ms four times, then 500 ms once: host work is held from 18 ms to 550 ms after a take.
    A producer that reads for 30 ms and then waits for its turn is held; close() releases it."""

    def produce(step):
        time.sleep(0.03)  # its reads
        wait_turn()  # then host work, in its turn
        return step

    stream = Prefetcher(produce, depth=1, workers=1)
    for away in (0.02, 0.02, 0.02, 0.5, 0.02):
        next(stream)
        time.sleep(away)
    next(stream)  # the take that wakes the producer of the next step: held 30 ms later
    time.sleep(0.1)
    began = time.perf_counter()
    stream.close()
    assert time.perf_counter() - began < 0.3  # not the rest of the 550 ms
    assert stream.stats()["held_count"] >= 1
    assert not any(t.is_alive() for t in stream._workers.threads)


def test_producers_held_past_the_window_start_again_after_the_next_take():
    """Away 20 ms, once 500 ms: host work is held from 18 ms to 550 ms after each take. Producers
    that read for 30 ms are held every step; a take wakes one of them, and when the window opens it
    wakes the others, so the stream keeps pace instead of waiting ~0.5 s a step for the bound."""

    def produce(step):
        time.sleep(0.03)  # its reads
        wait_turn()
        return step

    with Prefetcher(produce, depth=4, workers=4) as stream:
        for away in (0.02, 0.02, 0.02, 0.5, 0.02, 0.02):
            next(stream)
            time.sleep(away)
        began = time.perf_counter()
        got = []
        for _ in range(12):
            got.append(next(stream))
            time.sleep(0.02)
        elapsed = time.perf_counter() - began
        stats = stream.stats()
    assert got == list(range(6, 18))
    assert stats["held_count"] >= 4
    assert elapsed < 3.0, elapsed  # 12 x (20 ms + a wait of about the 30 ms reads); not 12 x 0.5 s


def test_a_piece_ends_where_the_producer_says_its_host_work_ends():
    """``host_work_done`` before a wait on an accelerator: the wait is not counted as host work."""

    def produce(step):
        wait_turn()
        time.sleep(0.004)  # host work
        host_work_done()
        time.sleep(0.3)  # waiting on a device: the consumer's cores are free
        return step

    with Prefetcher(produce, depth=2, workers=1) as stream:
        assert [next(stream) for _ in range(3)] == [0, 1, 2]
        pieces = list(stream._workers.shadow.work)
    assert len(pieces) >= 3 and 0.004 <= min(pieces) and max(pieces) < 0.2  # a wait counted: >= 0.3
