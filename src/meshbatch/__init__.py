"""meshbatch: language-model training batches built inside the JAX device mesh.

Public names load on first use. Importing ``meshbatch.kernels`` (pure device code) runs this file
first, as Python does for any subpackage; so that it pulls in no host module (tensorstore, the
pipeline, the cache layer), each name is resolved from its module only when asked for. The names
are written once, in ``__init__.pyi`` (which type checkers read); this file reads that stub.
"""

import ast
from importlib import import_module
from pathlib import Path

__version__ = "0.1.0"


def _exports() -> dict[str, str]:
    """public name -> the module that defines it, from the stub's ``from .x import Y as Y`` lines."""
    stub = ast.parse((Path(__file__).parent / "__init__.pyi").read_text())
    return {
        alias.asname or alias.name: f"{__name__}.{node.module}"
        for node in stub.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


_EXPORTS = _exports()
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'meshbatch' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
