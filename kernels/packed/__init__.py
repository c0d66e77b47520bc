"""Packed examples: the packing plans and the build of packed rows (``packed_rows``)."""
