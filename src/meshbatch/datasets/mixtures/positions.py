"""Position logs of a token-balanced mixture: real rows and tokens per spec, step by step.

Counts come from the checkpoint state (``pipeline.state_dict()``), so they are the exact rows and
real tokens each spec has given, never estimates, and the same on every process:

    log = PositionLog()
    for step, batch in enumerate(batches):
        metrics = log.update(step, pipeline.state_dict())   # a plain dict for any logger
        # {"data/web/rows": 96, "data/web/tokens": 393216, "data/web/step_rows": 32, ...}
    log.plot("consumed.png")                               # consumed tokens per spec over steps
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def positions(state_dict: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """``{spec: {"rows": row_offset, "tokens": token_offset}}`` of a token-balanced state_dict
    (carried specs included; a missing token offset reads as 0, as on load)."""
    entries = state_dict.get("datasets")
    if not isinstance(entries, list):
        raise ValueError(f"not a token-balanced state_dict: no 'datasets' list (keys {sorted(state_dict)})")
    return {
        entry["spec"]: {"rows": int(entry.get("row_offset", 0)), "tokens": int(entry.get("token_offset", 0))}
        for entry in entries
    }


class PositionLog:
    """Per-step real rows and tokens per spec, accumulated from successive state_dicts.

    Args:
        prefix: the metric names' prefix (``"data/"`` gives ``data/<spec>/rows``).
    """

    def __init__(self, prefix: str = "data/"):
        self.prefix = prefix
        self.steps: list[int] = []
        self.history: list[dict[str, dict[str, int]]] = []

    def update(self, step: int, state_dict: Mapping[str, Any]) -> dict[str, int]:
        """Record the position after ``step`` and return it as flat metrics: totals and, from the
        second update on, what this step added (``step_rows``, ``step_tokens``)."""
        now = positions(state_dict)
        before = self.history[-1] if self.history else None
        self.steps.append(int(step))
        self.history.append(now)
        out = {}
        for spec, counts in now.items():
            out[f"{self.prefix}{spec}/rows"] = counts["rows"]
            out[f"{self.prefix}{spec}/tokens"] = counts["tokens"]
            if before is not None:
                prior = before.get(spec, {"rows": 0, "tokens": 0})
                out[f"{self.prefix}{spec}/step_rows"] = counts["rows"] - prior["rows"]
                out[f"{self.prefix}{spec}/step_tokens"] = counts["tokens"] - prior["tokens"]
        return out

    def tokens(self) -> dict[str, list[int]]:
        """Consumed tokens per spec at each recorded step (0 before a spec appears)."""
        specs = list(dict.fromkeys(spec for entry in self.history for spec in entry))
        return {spec: [entry.get(spec, {"tokens": 0})["tokens"] for entry in self.history] for spec in specs}

    def plot(self, path: str, *, title: str = "consumed tokens per source"):
        """Draw consumed tokens per spec over steps to ``path`` (any matplotlib format)."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(7, 4))
        for spec, values in self.tokens().items():
            axes.plot(self.steps, values, label=spec)
        axes.set_xlabel("step")
        axes.set_ylabel("real tokens consumed")
        axes.set_title(title)
        axes.legend()
        figure.tight_layout()
        figure.savefig(path)
        plt.close(figure)
        return path
