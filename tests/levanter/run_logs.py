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


def levanter_exit_abort(entry: str, returncode: int, output: str) -> bool:
    """Whether a run of Levanter's own ``train_lm`` (``levanter.main.train_lm``, no meshbatch in
    the process) finished its training and then aborted at interpreter exit: Levanter
    1.2.dev1644's background loader thread can still be inside jax's C++ code when Python
    finalizes, which ends the process with ``terminate called after throwing an instance of``
    and SIGABRT (seen once in CI, after the tracker's ``finish`` event). The run's metrics and
    checkpoints are complete by then; anything else is a failure."""
    if entry != "levanter.main.train_lm" or returncode != -6:
        return False
    finish = output.rfind('"event": "finish"')
    return finish >= 0 and "terminate called" in output[finish:]
