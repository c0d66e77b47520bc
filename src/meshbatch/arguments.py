"""Argument checks at the host boundary: one helper per kind of value, one exception per mistake.

Every public constructor and function checks what it is given here, before anything reaches a
kernel, and names the parameter in the message:

    wrong type (a float, a bool, a string where an int is expected)   TypeError
    right type, wrong value (negative, zero, out of range, unknown)    ValueError
    an index outside its range                                         IndexError (callers)

    check_int("seq_len", 0, low=1)       -> ValueError: seq_len must be >= 1 (got seq_len=0)
    check_int("seq_len", 4.0, low=1)     -> TypeError: seq_len must be an int (got seq_len=4.0)
    as_key(7)                            -> jax.random.key(7)
    as_key(None)                         -> TypeError: key must be a JAX PRNG key or an int seed ...

Nothing is clamped, truncated or defaulted silently: ``check_int`` refuses ``2.0`` rather than
reading it as ``2``, and ``check_bool`` refuses ``"no"`` rather than reading it as ``True``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import get_args

import numpy as np

from meshbatch.kernels import typed_key

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def is_int(value) -> bool:
    """A Python or numpy integer, and not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def check_int(name: str, value, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as a Python int in ``[low, high]`` (either bound optional).

    Raises:
        TypeError: ``value`` is not an integer (bools and integral floats included).
        ValueError: ``value`` is outside ``[low, high]``.
    """
    if not is_int(value):
        raise TypeError(f"{name} must be an int (got {name}={value!r})")
    value = operator.index(value)
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low} (got {name}={value})")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high} (got {name}={value})")
    return value


def check_optional_int(name: str, value, *, low: int | None = None, high: int | None = None) -> int | None:
    """``check_int`` that lets ``None`` through."""
    return None if value is None else check_int(name, value, low=low, high=high)


def check_token_id(name: str, value, *, optional: bool = False) -> int | None:
    """A token id that fits int32 (``None`` only when ``optional``)."""
    if value is None and optional:
        return None
    return check_int(name, value, low=INT32_MIN, high=INT32_MAX)


def check_int_array(name: str, value) -> np.ndarray:
    """``value`` as a numpy integer array (any shape); strings, floats and objects are refused."""
    array = (
        None if isinstance(value, str | bytes) else np.asarray(value, dtype=object if value is None else None)
    )
    if array is None or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must be integers (got {name}={value!r})")
    return array


def check_bool(name: str, value) -> bool:
    """A real bool: ``"no"``, ``0`` and ``None`` are refused, not read by truthiness."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool (got {name}={value!r})")
    return bool(value)


def check_float(name: str, value, *, low: float | None = None, high: float | None = None) -> float:
    """A finite real number in ``[low, high]``; bools and strings are refused."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number (got {name}={value!r})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite (got {name}={value!r})")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low} (got {name}={value!r})")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high} (got {name}={value!r})")
    return value


def _options(choices) -> tuple:
    """The values a ``Literal[...]`` (optionally ``| None``) or a collection allows."""
    args = get_args(choices)
    if not args:
        return tuple(choices)
    out: list = []
    for arg in args:
        if arg is type(None):
            out.append(None)
        elif get_args(arg):
            out.extend(_options(arg))
        else:
            out.append(arg)
    return tuple(out)


def check_choice(name: str, value, choices):
    """``value`` is one of ``choices`` (a collection, or a ``Literal[...]`` type, ``| None`` allowed)."""
    options = _options(choices)
    if not isinstance(value, str | type(None)) or value not in options:
        raise ValueError(f"{name}={value!r} is not one of {options}")
    return value


def check_step(step) -> int:
    """A training step: a non-negative Python int (numpy ints included)."""
    if not is_int(step):
        raise TypeError(f"step must be a non-negative int (got step={step!r})")
    if step < 0:
        raise ValueError(f"step must be a non-negative int (got step={step!r})")
    return operator.index(step)


def check_names(name: str, value) -> tuple[str, ...]:
    """A mesh axis name or a non-empty sequence of them, as a tuple."""
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Sequence) or not names or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{name} must be a mesh axis name or a sequence of them (got {name}={value!r})")
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise ValueError(
            f"{name} must name each mesh axis once (got {name}={tuple(names)!r}: {repeated} repeated)"
        )
    return tuple(names)


# The one key normaliser lives with the kernels (they may not import host modules); every host
# entry point calls it as ``as_key``.
as_key = typed_key
