"""Layering: ``meshbatch.kernels`` imports nothing but jax, numpy, equinox and jaxtyping, and no
meshbatch host module; ``src`` imports kernels only through ``meshbatch.kernels``'s exports and
``meshbatch.kernels.internal``; no dataset family imports another's modules; no two modules import
each other in a circle; and a folder's module names are unique (file names may repeat across
folders: the folder says which).

One fresh interpreter (``probe``) runs ``STEPS`` in order and reports ``sys.modules`` after each:
the first step sees a fresh interpreter; a later step's snapshot holds what every step so far
loaded (``import meshbatch`` loads ``meshbatch.kernels`` itself, so its snapshot is the fresh one),
and what a step newly loaded is its snapshot minus the one before.
"""

import ast
import json
import pathlib
import pkgutil
import re
import subprocess
import sys
from collections.abc import Iterator

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
    """``from meshbatch.kernels.<module> import`` in src would bypass ``kernels/__init__`` and
    ``kernels/internal``."""
    root = pathlib.Path(__file__).parents[1] / "src" / "meshbatch"
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for path in root.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"^\s*(from|import) meshbatch\.kernels\.(?!internal\b)", line)
    ]
    assert not offenders, f"import from meshbatch.kernels directly: {offenders}"


# -- the tree: families that stand alone, no import cycle, names unique within a folder ----------

ROOT = pathlib.Path(__file__).parents[1]
# the folders of one dataset family each (host half and kernels): a family imports the shared layers
# (kernels, shuffles, cache, datasets' protocol) and none of another family's modules; the
# mixtures combine other families' datasets through the protocol, not their modules
FAMILIES = {
    "splice": ("src/meshbatch/datasets/splice", "kernels/splice"),
    "mixtures": ("src/meshbatch/datasets/mixtures", "kernels/mixtures"),
    "packed": ("src/meshbatch/datasets/packed", "kernels/packed"),
    "preblocked": ("src/meshbatch/datasets/preblocked", "kernels/preblocked"),
}


def _modules(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    return sorted(p for d in ("src/meshbatch", "kernels") for p in (root / d).rglob("*.py"))


def _family(path: pathlib.Path, root: pathlib.Path = ROOT) -> str | None:
    where = path.parent.relative_to(root).as_posix()
    return next((f for f, homes in FAMILIES.items() if any(where.startswith(h) for h in homes)), None)


def _cross_family(imports: dict[pathlib.Path, set[pathlib.Path]], root: pathlib.Path = ROOT) -> list[str]:
    """``importer -> imported`` for each import of one family's file by another family's file."""
    return sorted(
        f"{a.relative_to(root)} -> {b.relative_to(root)}"
        for a, targets in imports.items()
        for b in targets
        if _family(a, root) and _family(b, root) and _family(a, root) != _family(b, root)
    )


def test_no_dataset_family_imports_another():
    assert not _cross_family(_file_imports()), _cross_family(_file_imports())


def test_the_family_check_can_fail(tmp_path):
    splice = tmp_path / "kernels/splice/pairs.py"
    packed = tmp_path / "src/meshbatch/datasets/packed/packed_dataset.py"
    shared = tmp_path / "kernels/batch.py"
    assert _cross_family({splice: {shared}, packed: {splice, shared}}, tmp_path) == [
        "src/meshbatch/datasets/packed/packed_dataset.py -> kernels/splice/pairs.py"
    ]


def _name_clashes(paths: list[pathlib.Path], root: pathlib.Path = ROOT) -> dict[str, list[str]]:
    """Import names that two entries of one folder both claim: ``x.py`` beside a package ``x/``,
    or names that differ only in case (one file on a case-insensitive disk)."""
    names: dict[str, list[str]] = {}
    for path in paths:
        module = path.parent if path.name == "__init__.py" else path.with_suffix("")
        if path.name != "__main__.py" and module != root:
            key = f"{module.parent.relative_to(root).as_posix()}/{module.name.lower()}"
            names.setdefault(key, []).append(str(path.relative_to(root)))
    return {n: sorted(ps) for n, ps in names.items() if len(ps) > 1}


def test_module_names_are_unique_within_their_folder():
    """One import name, one file: a folder's modules and packages do not share a name (a
    ``fetch.py`` in two folders is fine; the folder says which one it is)."""
    assert not _name_clashes(_modules()), _name_clashes(_modules())


def test_the_name_check_can_fail(tmp_path):
    for name in (
        "cache/reader.py",
        "cache/Reader.py",
        "cache/lazy.py",
        "cache/lazy/__init__.py",
        "x/reader.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    clashes = _name_clashes(sorted(tmp_path.rglob("*.py")), tmp_path)
    assert clashes == {
        "cache/lazy": ["cache/lazy.py", "cache/lazy/__init__.py"],
        "cache/reader": ["cache/Reader.py", "cache/reader.py"],
    }


def _dotted(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    parts = ["meshbatch", *parts[2:]] if parts[0] == "src" else ["meshbatch", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(name: str, path: pathlib.Path) -> Iterator[tuple[str, bool]]:
    """What a module imports anywhere, lazily too: ``(dotted name, from-import)`` for the module of
    each ``import x`` / ``from x import`` and each ``x.name`` a ``from x import name`` may mean."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            yield base, True
            yield from ((f"{base}.{a.name}", True) for a in node.names)
        elif isinstance(node, ast.Import):
            yield from ((a.name, False) for a in node.names)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the meshbatch modules (not packages) it imports with ``from ... import``."""
    files = {_dotted(p): p for p in _modules()}
    return {
        name: {
            t
            for t, from_import in _imports(name, path)
            if from_import and t in files and files[t].name != "__init__.py"
        }
        - {name}
        for name, path in files.items()
    }


def _file_imports() -> dict[pathlib.Path, set[pathlib.Path]]:
    """File -> the meshbatch files it imports: a module's, or a package's ``__init__.py`` where the
    import names the package (``from meshbatch.datasets.packed import PackedDataset``)."""
    files = {_dotted(p): p for p in _modules()}
    out: dict[pathlib.Path, set[pathlib.Path]] = {}
    for name, path in files.items():
        targets = set()
        for target, _ in _imports(name, path):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target:
                targets.add(files[target])
        out[path] = targets - {path}
    return out


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
