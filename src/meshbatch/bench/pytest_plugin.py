"""A pytest fixture for a user's CI: ``jit_bench`` counts compiles, measures, and gates.

Load it in a ``conftest.py``::

    pytest_plugins = ["meshbatch.bench.pytest_plugin"]

    def test_my_step_never_recompiles(jit_bench):
        jit_bench.assert_no_recompiles(step_fn, (state, batch0), [("step 1", (state, batch1))])

    def test_no_slowdown(jit_bench):
        m = jit_bench.measure(step_fn, (state, batch0), name="step")
        jit_bench.assert_no_regression([m], "benchmarks/baseline.json", tolerance=0.3)
"""

from __future__ import annotations

import pytest

from .compile_count import count_compiles
from .gates import assert_no_recompiles, assert_no_regression
from .measure import measure


class JitBench:
    """What the ``jit_bench`` fixture gives a test."""

    count_compiles = staticmethod(count_compiles)
    measure = staticmethod(measure)
    assert_no_recompiles = staticmethod(assert_no_recompiles)
    assert_no_regression = staticmethod(assert_no_regression)


@pytest.fixture
def jit_bench() -> JitBench:
    """Compile counting, measuring and gating for one test (``JitBench``)."""
    return JitBench()
