"""The README's code runs as a new user would run it: each ```python block on its own, in a fresh
interpreter (this environment's), from an empty directory."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def repo_root() -> Path:
    """The checkout: the nearest folder above this file holding pyproject.toml."""
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    raise FileNotFoundError(f"no pyproject.toml above {__file__}")


README = repo_root() / "README.md"
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
TIMEOUT_S = 300  # seconds of CPU-device jax: about 10 s alone, more on a loaded machine


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def run_block(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, from the empty folder ``tmp_path / "cwd"`` with its temporary
    files under ``tmp_path / "tmp"``, in the environment a user has: the test suite's strict
    numerics (conftest.py) left out; its CPU devices and compilation cache kept."""
    for folder in ("cwd", "tmp"):
        (tmp_path / folder).mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_NUMPY_")}
    env["TMPDIR"] = str(tmp_path / "tmp")
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path / "cwd", env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip


def test_the_readme_is_short_and_starts_with_the_training_loop():
    text = README.read_text()
    assert len(text.splitlines()) <= 100, f"README.md has {len(text.splitlines())} lines (at most 100)"
    blocks = python_blocks(text)
    assert blocks, "README.md has no ```python block"
    assert "Pipeline(" in blocks[0] and "iterate_from(" in blocks[0], blocks[0]
    assert re.findall(r"`make (\w+)`", text) and set(re.findall(r"`make (\w+)`", text)) == {"demo", "test"}


@pytest.mark.parametrize("index", range(len(python_blocks(README.read_text()))))
def test_readme_python_block_runs(tmp_path, index):
    code = python_blocks(README.read_text())[index]
    result = run_block(code, tmp_path)
    assert result.returncode == 0, (
        f"README.md's python block {index} failed (exit {result.returncode}):\n{code}\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    )
    if index == 0:  # the training loop: 20 steps, then its loss
        assert re.search(r"step 19: loss \d+\.\d{3}", result.stdout), result.stdout[-2000:]
    written = list((tmp_path / "cwd").iterdir())
    assert not written, f"the block wrote into its working directory: {written}"


def test_the_runner_fails_on_a_broken_block(tmp_path):
    """A block that raises fails its test: the runner reports a nonzero exit."""
    text = "x\n```python\nimport meshbatch\nraise ValueError('broken')\n```\n"
    (block,) = python_blocks(text)
    result = run_block(block, tmp_path)
    assert result.returncode != 0 and "ValueError: broken" in result.stderr
