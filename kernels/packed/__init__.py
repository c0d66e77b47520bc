"""Packed examples: the packing rules (``pack_rows``) and the build of packed rows (``packed_rows``)."""
