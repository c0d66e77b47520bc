"""Reading a ``train_lm`` run's metrics back from its JSON log lines."""

import json
import pathlib


def read_metrics(logs: pathlib.Path) -> dict:
    """The metrics of every ``*.log`` under ``logs``, by step (``"summary"``: the tracker's summary)."""
    metrics: dict = {}
    for log in logs.rglob("*.log"):
        for line in log.read_text().splitlines():
            if '"event": "log"' in line:
                record = json.loads(line.split(" :: ", 1)[1])
                metrics.setdefault(record.get("step"), {}).update(record["metrics"])
            elif '"event": "summary"' in line:
                metrics.setdefault("summary", {}).update(json.loads(line.split(" :: ", 1)[1])["metrics"])
    return metrics
