"""Every recorded run of the least-consumed selection against the heap, in one picture and one table.

Reads the ``selection_runN`` entries of ``bench_mixture.json`` (each a whole
``bench_mixture.py --part selection`` run, with its command) and draws, per run, the heap /
kernel ratio at 64 and 256 sources (the median of the rounds' medians, as in each run's table),
with the range over the rounds, against issue 21's 10x line; prints the same as a Markdown table.
The kernel is what the pipeline ran at the time: the merge in runs 1 and 2, the tournament from
run 3 (a kernel call; from run 12 inside a jitted program; from run 18 climbing every level at
once up to 7 levels, so at 64 sources, not at 256; from run 23 the table a column per source and
each source's key made a row ahead, every level at once up to 8 levels, 256 sources too).

    python benchmarks/plot_mixture_runs.py    # -> benchmarks/bench_mixture_runs.png
"""

from __future__ import annotations

import json
import pathlib
import re

HERE = pathlib.Path(__file__).parent
SIZES = (64, 256)
TARGET = 10.0
# what changed in the kernel between runs (bench_mixture.json holds no dates; RESULTS.md does)
EPOCHS = {
    1: "merge",
    3: "tree",
    5: "caller's thread",
    12: "in a program",
    18: "at once, 7 levels",
    23: "key ahead, at once, 8 levels",
}


def recorded_runs(path: pathlib.Path) -> dict[int, dict[int, tuple[float, float, float]]]:
    """``{run: {sources: (ratio, low, high)}}`` for the runs at ``SIZES`` sources."""
    data = json.loads(path.read_text())
    runs = {}
    for key, run in data.items():
        match = re.fullmatch(r"selection_run(\d+)", key)
        if not match:
            continue
        rows = {row["sources"]: row for row in run["selection"] if row["sources"] in SIZES}
        if set(rows) != set(SIZES):
            raise ValueError(f"{key} in {path} lacks a row at {SIZES} sources: {sorted(rows)}")
        runs[int(match.group(1))] = {
            sources: (row["ratio"], *row["ratio_range"]) for sources, row in rows.items()
        }
    return dict(sorted(runs.items()))


def table(runs: dict[int, dict[int, tuple[float, float, float]]]) -> str:
    lines = [
        "| run | heap / kernel, 64 sources (rounds) | 256 sources (rounds) | both >= 10x |",
        "|---:|---:|---:|:---:|",
    ]
    for run, sizes in runs.items():
        cells = [f"{r:.1f}x ({low:.1f} .. {high:.1f})" for r, low, high in (sizes[s] for s in SIZES)]
        met = all(sizes[s][0] >= TARGET for s in SIZES)
        lines.append(f"| {run} | {cells[0]} | {cells[1]} | {'yes' if met else 'no'} |")
    return "\n".join(lines)


def plot(runs: dict[int, dict[int, tuple[float, float, float]]], out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.8))
    numbers = list(runs)
    for offset, sources, marker in ((-0.12, 64, "o"), (0.12, 256, "s")):
        ratio = [runs[n][sources][0] for n in numbers]
        below = [runs[n][sources][0] - runs[n][sources][1] for n in numbers]
        above = [runs[n][sources][2] - runs[n][sources][0] for n in numbers]
        axes.errorbar(
            [n + offset for n in numbers], ratio, yerr=[below, above], fmt=marker, capsize=3,
            label=f"{sources} sources (median of rounds; bar: rounds' range)",
        )  # fmt: skip
    axes.axhline(TARGET, color="0.3", linestyle="--", linewidth=1, label="issue 21's target (10x)")
    for first, label in EPOCHS.items():
        if first > numbers[0]:
            axes.axvline(first - 0.5, color="0.75", linewidth=1)
        axes.annotate(label, (first - 0.4, 0.98), xycoords=("data", "axes fraction"), va="top", fontsize=7)
    axes.set_xticks(numbers)
    axes.set_xlabel("recorded run (selection_runN in bench_mixture.json)")
    axes.set_ylabel("heap time / kernel time")
    axes.set_ylim(bottom=0)
    axes.set_title("Least-consumed selection of 4096 rows: the pipeline's kernel against the Python heap")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main() -> None:
    runs = recorded_runs(HERE / "bench_mixture.json")
    print(table(runs))
    out = HERE / "bench_mixture_runs.png"
    plot(runs, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
