"""Splice document datasets (``splice-document-dataset.md``): spec, schedules, diagnostics.

The spec (``spec``), its host-side tables (``tables``), schedule assembly (``schedule``) and
diagnostics (``diagnostics``) live here; the pipeline dataset is
``meshbatch.datasets.splice.SpliceLMDataset``, and ``meshbatch.datasets.splice_indexed`` fronts it
for index-based access (``SpliceDataset``, ``splice_batch``). This module only re-exports.
"""

from .diagnostics import coverage_counts as coverage_counts
from .diagnostics import pairs_per_doc as pairs_per_doc
from .diagnostics import validation_rows as validation_rows
from .schedule import build_schedule as build_schedule
from .schedule import splice_schedule as splice_schedule
from .spec import SpliceSpec as SpliceSpec
