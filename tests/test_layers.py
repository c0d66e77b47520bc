"""Layering: ``meshbatch.kernels`` imports nothing but jax, numpy, equinox and jaxtyping."""

import subprocess
import sys

import pytest

FORBIDDEN = ("tensorstore", "levanter", "haliax")


def _imports_after(statement: str) -> set[str]:
    """Top-level module names present in ``sys.modules`` after running ``statement`` afresh."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def test_kernels_import_no_io_or_levanter():
    loaded = _imports_after("import meshbatch.kernels")
    assert not loaded & set(FORBIDDEN), f"meshbatch.kernels pulled in {sorted(loaded & set(FORBIDDEN))}"
    assert {"jax", "numpy", "equinox", "jaxtyping"} <= loaded


@pytest.mark.parametrize("module", FORBIDDEN)
def test_the_check_can_fail(module):
    """The same probe does see a forbidden module when something imports it."""
    assert module in _imports_after(f"import meshbatch.kernels\nimport {module}")


def test_top_level_import_needs_no_levanter_or_tensorstore():
    """``import meshbatch`` loads the cache layer lazily and the Levanter adapter only on request."""
    loaded = _imports_after("import meshbatch")
    assert not loaded & set(FORBIDDEN), f"import meshbatch pulled in {sorted(loaded & set(FORBIDDEN))}"
    assert "levanter" in _imports_after("import meshbatch.levanter")
