"""Stream telemetry: consumer-wait quantiles against known sleeps, stall fraction, the depth rule."""

import time

import numpy as np
import pytest

from meshbatch.pipeline.prefetch import AutoDepth, Prefetcher
from meshbatch.pipeline.telemetry import StreamLog, quantiles


def sleeper(seconds: float):
    def produce(step):
        time.sleep(seconds)
        return step

    return produce


def consume(stream, steps: int, sleep_s: float) -> list[int]:
    got = []
    for _ in range(steps):
        got.append(next(stream))
        time.sleep(sleep_s)  # the stand-in training step
    return got


def test_waits_match_a_producer_slower_than_the_consumer():
    """Making a step takes 60 ms, the consumer's step 20 ms: once the queue is drained the consumer
    waits about 40 ms every step, and waits 2/3 of its time."""
    with Prefetcher(sleeper(0.06), depth=2, workers=1) as stream:
        assert consume(stream, 4, 0.02) == [0, 1, 2, 3]
        stream.reset_stats()  # past the start-up
        assert consume(stream, 20, 0.02) == list(range(4, 24))
        stats = stream.stats()
    assert stats["batches"] == 20
    assert 0.02 <= stats["wait_p50_s"] <= 0.1, stats
    assert stats["wait_p50_s"] <= stats["wait_p95_s"] <= stats["wait_p99_s"] <= stats["wait_max_s"]
    assert 0.04 <= stats["step_p50_s"] <= 0.15, stats
    assert 0.35 <= stats["stall_fraction"] <= 0.9, stats
    assert stats["ready_min"] == 0
    assert 0.05 <= stats["make_p50_s"] <= 0.2, stats


def test_waits_vanish_when_the_producer_keeps_up():
    """Making a step takes 5 ms, the consumer's step 30 ms: batches are ready when it asks."""
    with Prefetcher(sleeper(0.005), depth=3, workers=1) as stream:
        consume(stream, 3, 0.03)
        stream.reset_stats()
        consume(stream, 20, 0.03)
        stats = stream.stats()
        occupancy = stream.occupancy()
    assert stats["wait_p50_s"] < 0.01, stats
    assert stats["stall_fraction"] < 0.2, stats
    assert stats["ready_mean"] >= 1
    assert occupancy.shape == (20, 2) and np.all(np.diff(occupancy[:, 0]) > 0)


def test_quantiles_are_numpy_percentiles():
    values = list(np.linspace(0, 1, 101))
    q = quantiles(values, "wait")
    assert q == pytest.approx(
        {"wait_p50_s": 0.5, "wait_p95_s": 0.95, "wait_p99_s": 0.99, "wait_max_s": 1.0, "wait_mean_s": 0.5}
    )


def test_auto_depth_rule():
    """depth = clamp(ceil(make_max / step_min) + 1, 2, max_depth), from the recorded times."""
    rule = AutoDepth(max_depth=6, initial=3, window=8)
    log = StreamLog()

    def made(seconds, n=8):
        for step in range(n):
            log.add_made(step, seconds)

    assert rule.depth(log) == 3  # nothing measured yet
    for t in [0.0, 0.1, 0.2, 0.3, 0.4]:  # consumer step 0.1 s
        log.add_ask(t)
    made(0.25)  # a step takes 0.25 s to make
    assert rule.depth(log) == 4  # ceil(2.5) + 1
    made(0.9)
    assert rule.depth(log) == 6  # ceil(9) + 1, capped
    made(0.01)
    assert rule.depth(log) == 2  # floor: the window holds only fast steps now
    made(0.17)
    for t in [0.45, 0.8, 1.2]:  # consumer steps 0.05, 0.35, 0.4: the quickest counts
        log.add_ask(t)
    assert rule.depth(log) == 5  # ceil(0.17 / 0.05) + 1; the median step (0.1 s) would give 3
    log.clear()  # a report window (``Pipeline.reset_stats``) does not reset the depth
    assert log.made == [] and rule.depth(log) == 5
    with pytest.raises(ValueError, match="window=65"):
        AutoDepth(window=65)


def test_auto_depth_keeps_enough_steps_in_the_making():
    """A 40 ms producer and a 10 ms consumer: the depth grows to cover the making time."""
    with Prefetcher(sleeper(0.04), depth="auto", max_depth=8) as stream:
        assert consume(stream, 40, 0.01) == list(range(40))
        assert stream.depth >= 3
        assert stream.stats()["depth"] == stream.depth


def test_auto_depth_arguments_are_checked():
    with pytest.raises(ValueError, match="max_depth"):
        Prefetcher(sleeper(0), depth="auto", max_depth=1)
    with pytest.raises(TypeError, match="depth"):
        Prefetcher(sleeper(0), depth="deep")
