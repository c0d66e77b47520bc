"""Layering: ``meshbatch.kernels`` imports nothing but jax, numpy, equinox and jaxtyping, and no
meshbatch host module; ``src`` imports kernels only through ``meshbatch.kernels``'s exports.

One fresh interpreter (``probe``) runs ``STEPS`` in order and reports ``sys.modules`` after each:
the first step sees a fresh interpreter; a later step's snapshot holds what every step so far
loaded (``import meshbatch`` loads ``meshbatch.kernels`` itself, so its snapshot is the fresh one),
and what a step newly loaded is its snapshot minus the one before.
"""

import json
import pathlib
import pkgutil
import re
import subprocess
import sys

import pytest

import meshbatch.kernels

FORBIDDEN = ("tensorstore", "levanter", "haliax")
STEPS = (
    "import meshbatch.kernels",
    "import meshbatch",
    "import tensorstore",
    "import haliax",
    "import meshbatch.pipeline.pipeline",
    "import meshbatch.levanter",
)
# the step that imports each forbidden module (``meshbatch.levanter`` imports levanter)
IMPORTED_BY = {
    "tensorstore": "import tensorstore",
    "haliax": "import haliax",
    "levanter": "import meshbatch.levanter",
}


@pytest.fixture(scope="module")
def probe() -> dict[str, set[str]]:
    """``sys.modules`` after each of ``STEPS``, run in that order in one fresh interpreter."""
    code = (
        "import json, sys\nsnapshots = {}\n"
        + "".join(f"{step}\nsnapshots[{step!r}] = sorted(sys.modules)\n" for step in STEPS)
        + "print(json.dumps(snapshots))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {step: set(modules) for step, modules in json.loads(result.stdout.splitlines()[-1]).items()}


def _modules_after(probe, step: str) -> set[str]:
    return probe[step]


def _new_at(probe, step: str) -> set[str]:
    """Modules ``step`` loaded that no step before it had."""
    i = STEPS.index(step)
    return probe[step] - (probe[STEPS[i - 1]] if i else set())


def _top(modules: set[str]) -> set[str]:
    """Top-level package names of ``modules``."""
    return {name.split(".")[0] for name in modules}


def _host_modules(modules: set[str]) -> set[str]:
    """meshbatch modules outside ``meshbatch.kernels`` (the package itself aside)."""
    return {m for m in modules if m.startswith("meshbatch.") and not m.startswith("meshbatch.kernels")}


def test_kernels_import_no_io_or_levanter(probe):
    loaded = _top(_modules_after(probe, "import meshbatch.kernels"))
    assert not loaded & set(FORBIDDEN), f"meshbatch.kernels pulled in {sorted(loaded & set(FORBIDDEN))}"
    assert {"jax", "numpy", "equinox", "jaxtyping"} <= loaded


def test_the_kernels_probe_covers_every_kernel_module(probe):
    """``import meshbatch.kernels`` loads every module under it, so the checks above hold for each
    (a kernel module that it left unloaded would go unchecked)."""
    every = {m.name for m in pkgutil.walk_packages(meshbatch.kernels.__path__, "meshbatch.kernels.")}
    assert len(every) > 20 and "meshbatch.kernels.splice.frames" in every, sorted(every)
    missed = every - _modules_after(probe, "import meshbatch.kernels")
    assert not missed, f"import meshbatch.kernels leaves {sorted(missed)} unloaded and unchecked"


@pytest.mark.parametrize("module", FORBIDDEN)
def test_the_check_can_fail(probe, module):
    """The same probe does see a forbidden module when something imports it."""
    assert module in _top(_new_at(probe, IMPORTED_BY[module]))


def test_top_level_import_needs_no_levanter_or_tensorstore(probe):
    """``import meshbatch`` loads the cache layer lazily and the Levanter adapter only on request."""
    assert "meshbatch.kernels" in _new_at(probe, "import meshbatch.kernels")  # a fresh start
    loaded = _top(_modules_after(probe, "import meshbatch"))
    assert not loaded & set(FORBIDDEN), f"import meshbatch pulled in {sorted(loaded & set(FORBIDDEN))}"
    assert "levanter" in _top(_new_at(probe, "import meshbatch.levanter"))


def test_kernels_load_no_meshbatch_host_module(probe):
    loaded = _modules_after(probe, "import meshbatch.kernels")
    assert "meshbatch.kernels" in loaded
    assert not _host_modules(loaded), f"meshbatch.kernels loaded {sorted(_host_modules(loaded))}"


def test_the_host_module_check_can_fail(probe):
    assert "meshbatch.pipeline.pipeline" in _host_modules(
        _modules_after(probe, "import meshbatch.pipeline.pipeline")
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


# -- the tree: one folder per family, unique module names, no import cycle -----------------------

ROOT = pathlib.Path(__file__).parents[1]
# a word in a module's file name -> the folders its family lives in (``levanter/`` holds the
# adapter's config types of every family: the only package that may import levanter)
FAMILIES = {
    "splice": ("src/meshbatch/datasets/splice", "kernels/splice"),
    "mixture": ("src/meshbatch/datasets/mixtures", "kernels/mixtures"),
    "interleave": ("src/meshbatch/datasets/mixtures", "kernels/mixtures"),
    "balanced": ("src/meshbatch/datasets/mixtures", "kernels/splice"),
    "preblock": ("src/meshbatch/datasets/preblocked", "kernels/preblocked"),
    "pack": (
        "src/meshbatch/datasets/preblocked",
        "kernels/preblocked",
        "src/meshbatch/datasets/packed",
        "kernels/packed",
    ),
}
ADAPTERS = ("src/meshbatch/levanter",)


def _modules(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    return sorted(p for d in ("src/meshbatch", "kernels") for p in (root / d).rglob("*.py"))


def _misplaced(root: pathlib.Path) -> list[str]:
    out = []
    for path in _modules(root):
        where = path.parent.relative_to(root).as_posix()
        for word, homes in FAMILIES.items():
            if word in path.stem and not any(where.startswith(h) for h in homes + ADAPTERS):
                out.append(f"{path.relative_to(root)} (a {word} module outside {homes})")
    return out


def test_each_dataset_family_lives_in_its_folder():
    assert not _misplaced(ROOT), _misplaced(ROOT)


def test_the_family_check_can_fail(tmp_path):
    (tmp_path / "src/meshbatch/datasets/splice").mkdir(parents=True)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "src/meshbatch/datasets/splice/splice_spec.py").write_text("")
    (tmp_path / "src/meshbatch/splice_helpers.py").write_text("")
    assert _misplaced(tmp_path) == [
        "src/meshbatch/splice_helpers.py (a splice module outside "
        "('src/meshbatch/datasets/splice', 'kernels/splice'))"
    ]


def test_module_names_explain_themselves_once():
    """No two modules share a file name (``schedule``, ``fetch``, ``layout``, ``checks`` once each)."""
    names: dict[str, list[str]] = {}
    for path in _modules():
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    assert not {n: ps for n, ps in names.items() if len(ps) > 1}


def _dotted(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    parts = ["meshbatch", *parts[2:]] if parts[0] == "src" else ["meshbatch", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the meshbatch modules (not packages) it imports anywhere, lazily too."""
    import ast

    files = {_dotted(p): p for p in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
                edges |= {t for t in targets if t in files and files[t].name != "__init__.py"}
        graph[name] = edges - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_two_modules_import_each_other_in_a_circle():
    assert _cycle(_import_graph()) is None, _cycle(_import_graph())


def test_the_cycle_check_can_fail():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
