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
    # a spec that appears later counts from 0
    later = log.update(2, {"datasets": [*state(4)["datasets"], {"spec": "new", "row_offset": 5}]})
    assert later["data/new/step_rows"] == 5 and later["data/new/tokens"] == 0
    assert log.tokens()["new"] == [0, 0, 0]

    shown, other = log.grouped(top=8)
    assert list(shown) == SPECS[:-9:-1]  # the 8 with the most tokens, most first
    assert other["label"] == "other (249)"  # 248 specs and "new"
    assert other["low"] == [0, 0, 0]
    assert other["high"][-1] == 248 * 4 * (2**60 + 247)
    figure = log.plot(str(tmp_path / "consumed.png"))
    assert open(figure, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_few_specs_are_never_grouped():
    log = PositionLog()
    for step in range(3):
        log.update(step, state(step + 1, SPECS[:9]))
    shown, other = log.grouped(top=8)  # 9 specs: grouping one would only hide its name
    assert other is None and sorted(shown) == SPECS[:9]
