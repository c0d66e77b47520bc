"""The grid of bad arguments the argument tests call the public entry points with
(``test_fuzz_arguments.py``, ``test_preblock_arguments.py``): a valid ``Call``, one parameter
replaced by a value of ``BAD``; a refusal must be one of ``ALLOWED`` and name the parameter."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

BAD = [
    None, -1, 0, -(2**40), 2**70, 2.5, float("nan"), float("inf"), True, "abc", "", b"x", [1, 2],
    {}, (), np.float32(1.5), np.array([1, 2]), np.array([0.5]), np.int64(-7), object(),
]  # fmt: skip
ALLOWED = (TypeError, ValueError, IndexError, FileNotFoundError)  # the last: a path or field not there


class Call:
    """A valid call: ``fn(**kwargs)``; ``aliases`` maps a parameter to other names its errors use."""

    def __init__(self, fn: Callable, aliases: dict[str, tuple[str, ...]] | None = None, **kwargs):
        self.fn, self.kwargs, self.aliases = fn, kwargs, aliases or {}

    def names(self, param: str) -> tuple[str, ...]:
        return (param, *self.aliases.get(param, ()))


def grid(calls: dict[str, Call], per_param: int = len(BAD)) -> Iterator[tuple[str, str, object]]:
    """``(call, parameter, bad value)`` trials in a fixed order: each parameter with ``per_param``
    values of ``BAD``, the ``i``-th parameter starting at ``BAD[i * per_param]`` (cyclically), so
    fewer values per parameter still use all of ``BAD`` across parameters; ``len(BAD)``: every
    combination."""
    params = [(name, param) for name, call in calls.items() for param in call.kwargs]
    for i, (name, param) in enumerate(params):
        for j in range(per_param):
            yield name, param, BAD[(i * per_param + j) % len(BAD)]
