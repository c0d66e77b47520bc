"""The device meshes the tests build over the 8 virtual CPU devices (``conftest.py``)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh


def mesh_of(shape: int | tuple[int, ...], names: tuple[str, ...] = ("data",)) -> Mesh:
    """A mesh over the first ``prod(shape)`` devices: ``mesh_of(8)`` is one ``data`` axis of 8,
    ``mesh_of((2, 4), ("data", "model"))`` two axes."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if len(shape) != len(names):
        raise ValueError(f"mesh shape {shape} has {len(shape)} axes but names {names} has {len(names)}")
    count = int(np.prod(shape))
    if count > len(jax.devices()):
        raise ValueError(f"mesh shape {shape} needs {count} devices; there are {len(jax.devices())}")
    return Mesh(np.array(jax.devices()[:count]).reshape(shape), names)
