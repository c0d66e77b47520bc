"""Position logs of a token-balanced mixture: real rows and tokens per spec, step by step.

Counts come from the checkpoint state (``pipeline.state_dict()``), so they are the exact rows and
real tokens each spec has given, never estimates, and the same on every process:

    log = PositionLog()
    for step, batch in enumerate(batches):
        metrics = log.update(step, pipeline.state_dict())   # a plain dict for any logger
        # {"data/web/rows": 96, "data/web/tokens": 393216, "data/web/step_rows": 32, ...}
    log.plot("consumed.png")                               # consumed tokens per spec over steps

Cheap at hundreds of specs: a step is stored as two rows of Python ints (exact past 2^64, no
dict per spec), the metrics dict is the only per-spec work. The plot stays readable: the ``top``
specs by consumed tokens get a line each, the rest one line, their mean, over a band from their
least to their most (256 specs, ``top=8``: 8 lines and ``other (248)``).
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
        self.specs: dict[str, int] = {}  # spec -> its column, in order of first appearance
        self._rows: list[list[int]] = []  # per step, per column (columns added later are absent)
        self._tokens: list[list[int]] = []
        self._present: set[str] = set()  # the specs of the last update

    @property
    def history(self) -> list[dict[str, dict[str, int]]]:
        """Each recorded step as ``{spec: {"rows": .., "tokens": ..}}`` (built on demand)."""
        names = list(self.specs)
        return [
            {names[c]: {"rows": r, "tokens": t} for c, (r, t) in enumerate(zip(rows, tokens, strict=True))}
            for rows, tokens in zip(self._rows, self._tokens, strict=True)
        ]

    def update(self, step: int, state_dict: Mapping[str, Any]) -> dict[str, int]:
        """Record the position after ``step`` and return it as flat metrics: totals and, for a spec
        the previous update had too, what this step added (``step_rows``, ``step_tokens``). A
        spec new to the log (or back after an update without it) reports totals only: its
        starting count (a resumed spec's baseline) is not this step's work."""
        now = positions(state_dict)
        for spec in now:
            self.specs.setdefault(spec, len(self.specs))
        rows, tokens = [0] * len(self.specs), [0] * len(self.specs)
        for spec, counts in now.items():
            rows[self.specs[spec]] = counts["rows"]
            tokens[self.specs[spec]] = counts["tokens"]
        before_rows = self._rows[-1] if self.steps else []
        before_tokens = self._tokens[-1] if self.steps else []
        present, self._present = self._present, set(now)
        self.steps.append(int(step))
        self._rows.append(rows)
        self._tokens.append(tokens)
        out = {}
        for spec, counts in now.items():
            name, c = f"{self.prefix}{spec}", self.specs[spec]
            out[f"{name}/rows"] = counts["rows"]
            out[f"{name}/tokens"] = counts["tokens"]
            if spec in present:
                out[f"{name}/step_rows"] = counts["rows"] - before_rows[c]
                out[f"{name}/step_tokens"] = counts["tokens"] - before_tokens[c]
        return out

    def tokens(self) -> dict[str, list[int]]:
        """Consumed tokens per spec at each recorded step (0 before a spec appears)."""
        return {
            spec: [row[c] if c < len(row) else 0 for row in self._tokens] for spec, c in self.specs.items()
        }

    def grouped(self, top: int = 8) -> tuple[dict[str, list[int]], dict[str, list[float]] | None]:
        """What ``plot`` draws: the ``top`` specs with the most consumed tokens at the last step
        (ties: the earlier spec), and the rest as ``{"label", "mean", "low", "high"}`` per step
        (``None`` when no spec is left over)."""
        series = self.tokens()
        ranked = sorted(series, key=lambda spec: (-series[spec][-1], self.specs[spec]))
        if len(ranked) <= top + 1:  # grouping a single spec would hide its name for nothing
            return {spec: series[spec] for spec in ranked}, None
        rest = [series[spec] for spec in ranked[top:]]
        columns = list(zip(*rest, strict=True))
        other = {
            "label": f"other ({len(rest)})",
            "mean": [sum(c) / len(c) for c in columns],
            "low": [min(c) for c in columns],
            "high": [max(c) for c in columns],
        }
        return {spec: series[spec] for spec in ranked[:top]}, other

    def plot(self, path: str, *, title: str = "consumed tokens per source", top: int = 8):
        """Draw consumed tokens per spec over steps to ``path`` (any matplotlib format): the
        ``top`` specs by consumed tokens, the others as their mean over a min..max band."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        shown, other = self.grouped(top)

        def floats(values):  # counts past 2^63 are exact ints; matplotlib draws floats
            return [float(v) for v in values]

        figure, axes = plt.subplots(figsize=(7, 4))
        for spec, values in shown.items():
            axes.plot(self.steps, floats(values), label=spec)
        if other is not None:
            axes.fill_between(self.steps, floats(other["low"]), floats(other["high"]), color="0.8")
            axes.plot(self.steps, floats(other["mean"]), color="0.4", linestyle="--", label=other["label"])
        axes.set_xlabel("step")
        axes.set_ylabel("real tokens consumed")
        axes.set_title(title)
        axes.legend(fontsize="small", ncol=2 if len(shown) > 5 else 1)
        figure.tight_layout()
        figure.savefig(path)
        plt.close(figure)
        return path
