"""The pipeline's compiled programs, module-level, keyed by the dataset's value.

A program takes the device half of a dataset (``DeviceDataset``, an ``equinox.Module``) as an
argument: its static fields (configuration) pick the program, its arrays (tables) are inputs. Two
pipelines over equal datasets (same configuration, tables of the same shapes, any key) therefore
run the same compiled programs:

    Pipeline(CausalLMDataset(cache, 4), key=0, ...)   # compiles plan and build once
    Pipeline(CausalLMDataset(cache, 4), key=1, ...)   # equal device half: compiles nothing

``plan_program`` plans rows on the host's CPU device; ``build_program(static, mesh, host_plans)``
is the per-shard build (with the build stages) over a local mesh, one per configuration.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from meshbatch.datasets.protocol import DeviceDataset, Plan, Rows

# XLA options for a plan of few rows: the lowest backend level compiles a shuffle's plan in a
# fraction of the time, at a run-time cost that grows with the rows (RESULTS.md, "First batch").
FAST_COMPILE = (("xla_backend_optimization_level", 0),)


def plan_program(device: DeviceDataset, rows: Rows, state):
    """``device.plan(rows, state)``, jitted once per configuration and shape.

    A device half whose class sets ``fast_compile_plan_rows`` gets plans of at most that many
    rows compiled at XLA's lowest backend level (``FAST_COMPILE``): a plan that runs once per
    step over one batch of rows gains little at run time from what costs most of its compile.
    Integer results do not depend on it. The rows' count is static: no shape compiles twice.
    """
    if rows.position.shape[0] > getattr(type(device), "fast_compile_plan_rows", -1):
        return _plan_filtered(device, rows, state)
    arrays, static = eqx.partition((device, rows, state), eqx.is_array)
    return _plan_with_options(static, FAST_COMPILE)(arrays)


@eqx.filter_jit
def _plan_filtered(device: DeviceDataset, rows: Rows, state):
    return device.plan(rows, state)


@functools.cache
def _plan_with_options(static, options: tuple):
    """The plan of ``static`` (``eqx.partition``'s second half of ``(device, rows, state)``),
    compiled with XLA ``options``; one per configuration, like ``build_program``."""

    def plan(arrays):
        device, rows, state = eqx.combine(arrays, static)
        return device.plan(rows, state)

    return jax.jit(plan, compiler_options=dict(options))


@eqx.filter_jit
def build_program_single(device: DeviceDataset, plan: Plan, content):
    """``device.build(plan, content)`` on one device (no shard map), for index-based callers."""
    return device.build(plan, content)


@functools.cache
def build_program(static, mesh: Mesh, host_plans: bool):
    """The per-shard build of ``static`` (``eqx.partition``'s second half of ``(device, stages)``)
    over ``mesh``'s ``"local"`` axis: ``program(arrays, plan, content)`` when the host plans, else
    ``program(arrays, rows)`` (plan and build together on the devices)."""

    def per_shard(arrays, *inputs):
        device, stages = eqx.combine(arrays, static)
        if host_plans:
            plan, content = inputs
            batch = device.build(plan, content)
        else:
            plan, _ = device.plan(inputs[0], None)
            batch = device.build(plan, None)
        for stage in stages:
            batch = stage(batch, plan)
        return batch

    local = PartitionSpec("local")  # the tables replicated, every row input split by device
    in_specs = (PartitionSpec(), local, local) if host_plans else (PartitionSpec(), local)
    # One process: the host's stacked inputs go in as numpy and jit places them by its
    # in_shardings (one transfer, not a device_put of the tree and then the call). Several: jit
    # refuses numpy for a sharded input, so the caller places them first.
    shardings = tuple(NamedSharding(mesh, spec) for spec in in_specs)
    kernel = jax.jit(
        jax.shard_map(per_shard, mesh=mesh, in_specs=in_specs, out_specs=local), in_shardings=shardings
    )
    return kernel, shardings
