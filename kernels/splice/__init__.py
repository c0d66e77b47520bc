"""Splice kernels: frames (``frames``), closed-form row schedules (``splice_rows``) and their
placements (``pairs``, ``coverage_balanced``). Re-exported by ``meshbatch.kernels``."""
