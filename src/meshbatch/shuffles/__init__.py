"""Shuffles: keyed bijections of ``[0, length)`` (``shuffle_spec``) and their quality metrics
(``quality``). This module only re-exports; the kernels are ``meshbatch.kernels.shuffles``.
"""

from .quality import ShuffleMetrics as ShuffleMetrics
from .quality import chi2_battery as chi2_battery
from .quality import shuffle_metrics as shuffle_metrics
from .shuffle_spec import ShuffleSpec as ShuffleSpec
from .shuffle_spec import block_shuffle as block_shuffle
from .shuffle_spec import era_shuffle as era_shuffle
from .shuffle_spec import permutation as permutation
