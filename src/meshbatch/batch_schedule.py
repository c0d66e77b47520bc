"""Batch sizes by step, and where each step's batch starts in the example stream.

A schedule is a constant batch size or segments ``[(start_step, batch_size), ...]`` (Levanter's
``BatchSchedule``: the first segment starts at step 0, the last one runs forever):

    schedule = BatchSchedule([(0, 32), (100, 64)])
    schedule.batch_size(99), schedule.batch_size(100)     # 32, 64
    schedule.offset(101)                                  # 100 * 32 + 1 * 64 = 3264

Offsets are Python ints: they grow without bound and never reach a device.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from meshbatch.arguments import check_int, is_int

MAX_BATCH = 2**31 - 1  # rows of one global batch


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
    """Batch size per training step; see the module docstring.

    Args:
        schedule: an int, or ``(start_step, batch_size)`` pairs (or objects with ``.start`` and
            ``.value``, like Levanter's ``ScheduleStep``) with strictly increasing starts from 0.
    """

    schedule: int | Sequence

    def __post_init__(self):
        segments = self._segments()
        starts = [start for start, _ in segments]
        if starts[0] != 0:
            raise ValueError(f"the first batch-size segment must start at step 0 (got start={starts[0]})")
        if any(b <= a for a, b in itertools.pairwise(starts)):
            raise ValueError(f"batch-size segment starts must increase strictly (got starts={starts})")
        for start, size in segments:
            if size <= 0:
                raise ValueError(f"batch sizes must be positive (got batch_size={size} at step {start})")
        offsets = [0]
        for (start, size), (next_start, _) in itertools.pairwise(segments):
            offsets.append(offsets[-1] + (next_start - start) * size)
        object.__setattr__(self, "_starts", starts)
        object.__setattr__(self, "_sizes", [size for _, size in segments])
        object.__setattr__(self, "_offsets", offsets)

    def _segments(self) -> list[tuple[int, int]]:
        if is_int(self.schedule):
            return [(0, check_int("batch_size", self.schedule, high=MAX_BATCH))]
        if isinstance(self.schedule, Sequence) and not isinstance(self.schedule, str) and self.schedule:
            out = []
            for item in self.schedule:
                if hasattr(item, "value"):
                    start, size = item.start, item.value
                elif isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 2:
                    start, size = item
                else:
                    raise TypeError(
                        f"batch_size segments must be (start_step, batch_size) pairs (got {item!r})"
                    )
                out.append((check_int("start_step", start), check_int("batch_size", size, high=MAX_BATCH)))
            return out
        raise TypeError(
            f"batch_size must be a positive int or (start_step, batch_size) pairs (got {self.schedule!r})"
        )

    def _segment(self, step: int) -> int:
        return bisect.bisect_right(self._starts, check_int("step", step, low=0)) - 1

    def batch_size(self, step: int) -> int:
        """Examples in the batch of ``step``."""
        return self._sizes[self._segment(step)]

    def offset(self, step: int) -> int:
        """Examples consumed before ``step``: where its batch starts. O(log segments)."""
        step = check_int("step", step, low=0)  # a Python int: offsets never wrap
        i = self._segment(step)
        return self._offsets[i] + (step - self._starts[i]) * self._sizes[i]

    def steps_within(self, total: int, pad: bool = False) -> int:
        """Steps whose batches all fit in the first ``total`` examples: the first step that does
        not fit; with ``pad``, plus that step when it holds some of them (Levanter's
        ``DataLoader`` count: ``find_step_containing_offset(total)``, + 1 when it pads). O(log steps)."""
        low, high = 0, 1
        while self.offset(high) + self.batch_size(high) <= total:
            high *= 2
        while low < high:
            mid = (low + high) // 2
            if self.offset(mid) + self.batch_size(mid) <= total:
                low = mid + 1
            else:
                high = mid
        return low + (pad and self.offset(low) < total)

    def rows_within(self, step: int, total: int) -> int:
        """Rows of ``step``'s batch that hold examples of a ``total``-example stream (the rest pad)."""
        return max(0, min(self.batch_size(step), total - self.offset(step)))

    def rows(self, step: int, rows: np.ndarray, num_examples: int) -> tuple[np.ndarray, np.ndarray]:
        """The uint32 ``(position, epoch)`` of batch rows ``rows`` of ``step`` in a stream of epochs of
        ``num_examples``; the unbounded integers stay in Python.

        Raises:
            ValueError: the step reaches epoch ``2**32`` (epochs are numbered in 32 bits).
        """
        epoch0, position0 = divmod(self.offset(step), num_examples)  # Python ints: never wrap
        last_epoch = epoch0 + (position0 + self.batch_size(step) - 1) // num_examples
        if last_epoch > 2**32 - 1:
            raise ValueError(
                f"step={step} reaches epoch {last_epoch} >= 2**32 (epochs are numbered in 32 bits)"
            )
        position = position0 + rows.astype(np.int64)  # < n + batch_size < 2**33
        epoch = np.uint32(epoch0) + (position // num_examples).astype(np.uint32)
        return (position % num_examples).astype(np.uint32), epoch

    def unique_sizes(self) -> list[int]:
        """Every batch size the schedule uses."""
        return sorted(set(self._sizes))
