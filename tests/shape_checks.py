"""Run-time shape checking of the kernels and the dataset protocol in every test process.

``install_shape_checks()`` puts jaxtyping's import hook (checker: beartype) in front of
``SHAPE_CHECKED`` before they are imported: each function and ``eqx.Module`` there then checks
its arguments, return value and fields against their annotations (dtype, shape, and the sizes
named in them agreeing), and a false annotation fails the test that calls it. conftest calls it
in the pytest workers; ``mp_worker.py`` and the demo's test in the processes they start.

``unchecked()`` turns the checks off inside a block, for tests of the messages a user sees
without a checker: a value the annotation already excludes (``segment_mode="both"``) would
otherwise stop at the checker's ``TypeCheckError`` before the function's own ``ValueError``.
"""

from __future__ import annotations

import contextlib
import sys

import jaxtyping

SHAPE_CHECKED = ("meshbatch.kernels", "meshbatch.datasets.protocol")


def install_shape_checks() -> None:
    loaded = [m for m in SHAPE_CHECKED if m in sys.modules]
    assert not loaded, f"{loaded} imported before the shape-check hook: they would run unchecked"
    jaxtyping.install_import_hook(list(SHAPE_CHECKED), "beartype.beartype")


@contextlib.contextmanager
def unchecked():
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)
