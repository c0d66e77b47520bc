"""``meshbatch.errors`` gathers every error type the library defines, each the very class its
module raises."""

import ast
import importlib
import pathlib

import meshbatch.errors

SRC = pathlib.Path(__file__).parents[1] / "src" / "meshbatch"
BASES = ("Error", "Exception", "Failed", "Timeout", "Mismatch", "Lost", "Unsupported")


def defined_errors(root: pathlib.Path = SRC) -> dict[str, str]:
    """Public exception classes defined under ``root``: name -> defining module."""
    found = {}
    for path in root.rglob("*.py"):
        module = ".".join(("meshbatch", *path.relative_to(root).with_suffix("").parts))
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = [ast.unparse(b) for b in node.bases]
                if any(b.endswith(BASES) or b in found for b in bases) and node.name.endswith(BASES):
                    found[node.name] = module
    return found


def test_every_error_type_is_in_meshbatch_errors():
    found = defined_errors()
    assert {"CacheIntegrityError", "StreamClosedError", "DataOrderMismatch"} <= set(found), found
    assert sorted(found) == meshbatch.errors.__all__
    for name, module in found.items():
        assert getattr(meshbatch.errors, name) is getattr(importlib.import_module(module), name), name


def test_the_scan_finds_a_new_error(tmp_path):
    (tmp_path / "x.py").write_text(
        "class Quiet(ValueError):\n    pass\n\nclass LoudError(ValueError):\n    pass\n"
    )
    assert defined_errors(tmp_path) == {"LoudError": "meshbatch.x"}
