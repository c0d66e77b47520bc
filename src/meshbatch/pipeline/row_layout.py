"""Which rows of a global batch this process builds, and on which of its devices.

A global ``[batch, seq_len]`` batch is sharded over the mesh's data axes. Each process owns the
rows of its addressable devices; devices that replicate the same rows (other mesh axes) share one
fetch. Rows are built on a *local* mesh of this process's devices, so no step needs another
process, and the per-device results are stitched into the global arrays.

    mesh (data=4, model=2) over 8 devices, batch 8:  device (d, m) holds rows [2d, 2d + 2)
    this process holds devices with d in {0, 1}:     rows 0..3, each fetched once, built twice
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """The placement of one batch size on one mesh, from this process's point of view.

    Attributes:
        batch_size: global rows.
        sharding: ``NamedSharding`` of a ``[batch, ...]`` leaf (rows on the data axes).
        devices: this process's devices, in the order the local build mesh uses.
        device_rows: ``(start, stop)`` global rows held by each of ``devices``.
        rows: sorted unique global rows this process needs (what it plans and fetches).
        local_mesh: a 1-D mesh over ``devices``; per-device inputs are stacked along it.
        groups: positions in ``rows`` of each distinct device row range (devices that replicate
            the same rows share a group, and one fetch).
        device_group: the group of each of ``devices``.
        device_index: positions in ``rows`` of every device's rows, device after device, or
            ``None`` when that is ``rows`` itself (devices in row order, no replicas).
    """

    batch_size: int
    sharding: NamedSharding
    devices: tuple[jax.Device, ...]
    device_rows: tuple[tuple[int, int], ...]
    rows: np.ndarray
    local_mesh: Mesh
    groups: tuple[np.ndarray, ...]
    device_group: tuple[int, ...]
    device_index: np.ndarray | None

    @property
    def rows_per_device(self) -> int:
        return self.device_rows[0][1] - self.device_rows[0][0]

    @classmethod
    def create(cls, mesh: Mesh, data_axes: tuple[str, ...], batch_size: int) -> RowLayout:
        for axis in data_axes:
            if axis not in mesh.axis_names:
                raise ValueError(
                    f"data axis {axis!r} is not a mesh axis "
                    f"(data_axes={data_axes}, mesh axes: {mesh.axis_names})"
                )
        data_size = math.prod(mesh.shape[axis] for axis in data_axes)
        if batch_size % data_size != 0:
            raise ValueError(
                f"batch_size={batch_size} must be divisible by the data axes' size {data_size} "
                f"(axes {data_axes} of mesh {dict(mesh.shape)})"
            )
        sharding = NamedSharding(mesh, PartitionSpec(data_axes))
        index_map = sharding.addressable_devices_indices_map((batch_size,))
        if not index_map:
            raise ValueError(
                f"process {jax.process_index()} owns no device of the mesh {dict(mesh.shape)}: "
                "every process must hold some of the mesh's devices"
            )
        devices = tuple(sorted(index_map, key=lambda d: d.id))
        device_rows = tuple(index_map[d][0].indices(batch_size)[:2] for d in devices)
        rows = np.unique(np.concatenate([np.arange(start, stop) for start, stop in device_rows]))
        local_mesh = Mesh(np.array(devices), ("local",))
        ranges = sorted(set(device_rows))
        groups = tuple(np.searchsorted(rows, np.arange(start, stop)) for start, stop in ranges)
        device_group = tuple(ranges.index(r) for r in device_rows)
        index = np.concatenate([groups[g] for g in device_group])
        in_order = index.shape == rows.shape and bool((index == np.arange(rows.shape[0])).all())
        return cls(
            batch_size, sharding, devices, device_rows, rows, local_mesh, groups, device_group,
            None if in_order else index,
        )  # fmt: skip

    @property
    def identity(self) -> bool:
        """One device group holding ``rows`` in order (one device, or devices replicating one
        row range): per-group arrays need no indexing."""
        return len(self.groups) == 1

    def stack_rows(self, tree):
        """A tree of ``[len(rows), ...]`` arrays as each device's rows stacked along dim 0 in
        ``devices`` order (the same arrays, no copy, when that order is ``rows``' own)."""
        if self.device_index is None:
            return tree
        return jax.tree.map(lambda leaf: leaf[self.device_index], tree)

    def to_global(self, local: jax.Array) -> jax.Array:
        """Re-labels a local-mesh array (rows stacked per device) as the global batch leaf (its
        rows on the data axes, its other dimensions replicated)."""
        by_device = {shard.device: shard.data for shard in local.addressable_shards}
        spec = PartitionSpec(self.sharding.spec[0], *([None] * (local.ndim - 1)))
        sharding = NamedSharding(self.sharding.mesh, spec)
        shape = (self.batch_size, *local.shape[1:])
        order = sharding.addressable_devices_indices_map(shape)
        return jax.make_array_from_single_device_arrays(shape, sharding, [by_device[d] for d in order])
