"""The spine: plan -> fetch -> build into globally sharded batches. This module only re-exports.

``pipeline`` (``Pipeline``) drives a step (``meshbatch.batch_schedule`` maps steps to stream rows),
``row_layout`` maps rows to devices, ``fetch`` reads a step's spans coalesced into one buffer per
device, ``state_planner`` threads a stateful dataset's state in step order, ``prefetch`` keeps
batches ready in background threads and measures the consumer's wait.
"""

from ..batch_schedule import BatchSchedule as BatchSchedule
from .pipeline import Pipeline as Pipeline
from .prefetch import EndOfStream as EndOfStream
from .prefetch import Prefetcher as Prefetcher
