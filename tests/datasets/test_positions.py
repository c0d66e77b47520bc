"""PositionLog at 256 specs: exact counts (past 2^64), per-step metrics, a readable grouped plot."""

from meshbatch.datasets.mixtures import PositionLog

SPECS = [f"s{i:03d}" for i in range(256)]


def state(step: int, specs=SPECS) -> dict:
    """Spec ``i`` has given ``(i + 1) * step`` rows of ``2^60 + i`` tokens (s255 a little more)."""
    entries = [
        {"spec": name, "row_offset": (i + 1) * step, "token_offset": (i + 1) * step * (2**60 + i)}
        for i, name in enumerate(specs)
    ]
    return {"datasets": entries, "interleave_version": 1}


def test_exact_metrics_at_256_specs(tmp_path):
    log = PositionLog()
    first = log.update(0, state(1))
    assert len(first) == 2 * 256 and first["data/s000/rows"] == 1
    metrics = log.update(1, state(3))
    assert len(metrics) == 4 * 256
    assert metrics["data/s255/tokens"] == 256 * 3 * (2**60 + 255) > 2**64  # exact Python ints
    assert metrics["data/s255/step_tokens"] == 256 * 2 * (2**60 + 255)
    assert metrics["data/s007/step_rows"] == 16
    assert log.history[1]["s001"] == {"rows": 6, "tokens": 6 * (2**60 + 1)}
    # a spec that appears later reports its totals only: its starting count (a resumed spec's
    # baseline) is not this step's work; from its next update on, what each step added
    later = log.update(2, {"datasets": [*state(4)["datasets"], {"spec": "new", "row_offset": 5}]})
    assert later["data/new/rows"] == 5 and later["data/new/tokens"] == 0
    assert "data/new/step_rows" not in later and "data/new/step_tokens" not in later
    assert log.tokens()["new"] == [0, 0, 0]

    shown, other = log.grouped(top=8)
    assert log.tokens()["new"] == [0, 0, 0]
    assert list(shown) == SPECS[:-9:-1]  # the 8 with the most tokens, most first
    assert other["label"] == "other (249)"  # 248 specs and "new"
    assert other["low"] == [0, 0, 0]
    assert other["high"][-1] == 248 * 4 * (2**60 + 247)
    figure = log.plot(str(tmp_path / "consumed.png"))
    assert open(figure, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_spec_new_to_the_log_reports_no_step_of_its_baseline():
    """A spec resumed with a baseline of 10^9 tokens: no step metric the update it appears, then
    each step's own tokens; one missing from an update starts over the same way."""
    log = PositionLog()
    log.update(0, {"datasets": [{"spec": "a", "row_offset": 4, "token_offset": 40}]})
    b = {"spec": "b", "row_offset": 0, "token_offset": 10**9}
    joined = log.update(1, {"datasets": [{"spec": "a", "row_offset": 6, "token_offset": 60}, b]})
    assert joined["data/a/step_tokens"] == 20 and "data/b/step_tokens" not in joined
    b = {"spec": "b", "row_offset": 2, "token_offset": 10**9 + 16}
    after = log.update(2, {"datasets": [{"spec": "a", "row_offset": 8, "token_offset": 80}, b]})
    assert after["data/b/step_tokens"] == 16 and after["data/b/step_rows"] == 2
    without_b = log.update(3, {"datasets": [{"spec": "a", "row_offset": 9, "token_offset": 90}]})
    assert "data/b/tokens" not in without_b
    back = log.update(4, {"datasets": [{"spec": "a", "row_offset": 9, "token_offset": 90}, b]})
    assert "data/b/step_tokens" not in back and back["data/a/step_tokens"] == 0


def test_few_specs_are_never_grouped():
    log = PositionLog()
    for step in range(3):
        log.update(step, state(step + 1, SPECS[:9]))
    shown, other = log.grouped(top=8)  # 9 specs: grouping one would only hide its name
    assert other is None and sorted(shown) == SPECS[:9]
