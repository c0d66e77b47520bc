"""Counting compiles in the tests: the library's public counter (``meshbatch.bench``)."""

from meshbatch.bench.compile_count import count_compiles as count_compiles
