"""Splice document datasets (``splice-document-dataset.md``), the whole family in one folder.

``splice_spec`` (the spec), ``tables`` (its host-side tables), ``splice_schedule`` (schedule
assembly and its diagnostics), ``selection`` (choosing the documents), ``splice_dataset``
(``SpliceLMDataset``, the pipeline dataset) and ``indexed`` (index-based access: ``SpliceDataset``,
``splice_batch``). Its kernels are ``meshbatch.kernels.splice``. This module only re-exports.
"""

from .splice_schedule import build_schedule as build_schedule
from .splice_schedule import coverage_counts as coverage_counts
from .splice_schedule import pairs_per_doc as pairs_per_doc
from .splice_schedule import splice_schedule as splice_schedule
from .splice_schedule import validation_rows as validation_rows
from .splice_spec import SpliceSpec as SpliceSpec
