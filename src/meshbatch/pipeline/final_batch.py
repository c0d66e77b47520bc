"""The end of a finite stream (``max_epochs``): drop the final partial step, or pad it.

A stream of ``total = max_epochs * num_examples`` examples rarely ends on a step boundary. With
``pad=False`` (``Pipeline``'s default) the last step is the last one whose batch fits whole; with
``pad=True`` one more step comes whose rows past the end are zeros in every leaf (tokens, loss
mask, segment ids, ...): the padding Levanter's ``DataLoader(pad_final_batch=True)`` makes
(``tree_zeros_like`` of an example), so no row past the end trains. That step has the same shape
as every other: it runs the same compiled build, and the zeroing is host work on the few shards
that hold padding rows (no program, so nothing compiles).

    total 106, batch 8:  drop -> 13 steps;  pad -> 14 steps, step 13 holds rows 104, 105 and 6 zero rows
    total 104, batch 8:  13 steps either way (no partial step)
"""

from __future__ import annotations

import jax
import numpy as np

from ..batch_schedule import BatchSchedule


def steps_in(schedule: BatchSchedule, total: int, pad: bool) -> int:
    """Steps of a stream of ``total`` examples: the whole ones, plus the partial one if ``pad``.
    The count Levanter's ``DataLoader`` makes (``find_step_containing_offset(total)``, + 1 when
    that step holds some examples and it pads)."""
    whole = schedule.steps_within(total)  # schedule.offset(whole) <= total < its end
    return whole + (pad and schedule.offset(whole) < total)


def real_rows(schedule: BatchSchedule, step: int, total: int) -> int:
    """Rows of ``step``'s batch that hold examples of a ``total``-example stream (the rest pad)."""
    return max(0, min(schedule.batch_size(step), total - schedule.offset(step)))


def pad_rows(tree, real: int):
    """``tree`` of global ``[batch, ...]`` arrays with rows ``real`` and on set to zero.

    Every process zeroes its own shards: a shard wholly before ``real`` stays as built; one
    holding padding rows is copied to the host, zeroed there and put back on its device.
    """

    def leaf(array: jax.Array) -> jax.Array:
        by_device = {}
        for shard in array.addressable_shards:
            start, stop, _ = shard.index[0].indices(array.shape[0])
            if stop <= real:
                by_device[shard.device] = shard.data
                continue
            host = np.array(shard.data)  # a writable copy
            host[max(real - start, 0) :] = 0
            by_device[shard.device] = jax.device_put(host, shard.device)
        order = array.sharding.addressable_devices_indices_map(array.shape)
        return jax.make_array_from_single_device_arrays(
            array.shape, array.sharding, [by_device[device] for device in order]
        )

    return jax.tree.map(leaf, tree)
