"""Layering: ``meshbatch.kernels`` imports nothing but jax, numpy, equinox and jaxtyping, and no
meshbatch host module; ``src`` imports kernels only through ``meshbatch.kernels``'s exports."""

import pathlib
import re
import subprocess
import sys

import pytest

FORBIDDEN = ("tensorstore", "levanter", "haliax")


def _modules_after(statement: str) -> set[str]:
    """Every module name in ``sys.modules`` after running ``statement`` in a fresh interpreter."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def _imports_after(statement: str) -> set[str]:
    """Top-level module names present in ``sys.modules`` after running ``statement`` afresh."""
    return {name.split(".")[0] for name in _modules_after(statement)}


def _host_modules(modules: set[str]) -> set[str]:
    """meshbatch modules outside ``meshbatch.kernels`` (the package itself aside)."""
    return {m for m in modules if m.startswith("meshbatch.") and not m.startswith("meshbatch.kernels")}


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


def test_kernels_load_no_meshbatch_host_module():
    loaded = _modules_after("import meshbatch.kernels")
    assert "meshbatch.kernels" in loaded
    assert not _host_modules(loaded), f"meshbatch.kernels loaded {sorted(_host_modules(loaded))}"


def test_the_host_module_check_can_fail():
    assert "meshbatch.pipeline" in _host_modules(
        _modules_after("import meshbatch.kernels, meshbatch.pipeline")
    )


def test_host_code_imports_kernels_only_through_their_exports():
    """``from meshbatch.kernels.<module> import`` in src would bypass ``kernels/__init__``."""
    root = pathlib.Path(__file__).parents[1] / "src" / "meshbatch"
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for path in root.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"^\s*(from|import) meshbatch\.kernels\.", line)
    ]
    assert not offenders, f"import from meshbatch.kernels directly: {offenders}"
