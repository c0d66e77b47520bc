"""Microbenchmarks of meshbatch's jitted kernels and of the pipeline step, and a compile counter.

``measure(fn, args, ...)`` times ``jax.jit(fn)``'s trace, lower and compile apart, its steady
run time as a distribution (on a GPU or TPU the device's own time from a ``jax.profiler``
trace), its dispatch rate, its recompiles across steps and keys, and XLA's cost and memory
analysis against the machine's measured copy bandwidth. ``run_bench`` measures the kernel
families and the pipeline step (``meshbatch bench``, docs/benchmarking.md); ``count_compiles``
counts the programs compiled in a block, for a CI gate (``meshbatch.bench.pytest_plugin``).
This module only re-exports.
"""

from .compile_count import compile_seconds as compile_seconds
from .compile_count import count_compiles as count_compiles
from .kernel_cases import CASES as CASES
from .kernel_cases import TINY as TINY
from .kernel_cases import Case as Case
from .kernel_cases import Shapes as Shapes
from .measure import Measurement as Measurement
from .measure import call_times as call_times
from .measure import copy_bandwidth as copy_bandwidth
from .measure import distribution as distribution
from .measure import measure as measure
from .report import ALL as ALL
from .report import format_table as format_table
from .report import run_bench as run_bench
from .report import write_report as write_report
