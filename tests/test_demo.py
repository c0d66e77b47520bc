"""`make demo`'s job runs end to end and writes its picture and table."""

import json
import os
import subprocess
import sys

# ``python -m meshbatch.demo`` with the kernels shape-checked (see shape_checks.py)
DEMO = (
    "import runpy, sys; sys.path.insert(0, {tests!r}); from shape_checks import install_shape_checks; "
    "install_shape_checks(); runpy.run_module('meshbatch.demo', run_name='__main__', alter_sys=True)"
)


def test_demo_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-c", DEMO.format(tests=os.path.dirname(__file__)), "--out", str(out),
         "--epochs", "1", "--batch-size", "16", "--seq-len", "512", "--num-docs", "3"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "8 cpu devices" in result.stdout
    assert (out / "splice_demo.png").stat().st_size > 10_000
    table = json.loads((out / "splice_demo.json").read_text())["table"]
    assert len(table) == 3 and all(row["covered"] == 1.0 for row in table)
    assert sum(row["rows_streamed"] for row in table) > 0
