"""Splice kernels: frames (``frames``), closed-form row schedules (``splice_rows``) and their
placements (``pairs``: enumerated or coverage-balanced). Re-exported by ``meshbatch.kernels``."""
