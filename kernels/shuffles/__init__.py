"""Keyed permutations of ``[0, n)`` (Feistel with cycle walking, LCG, PCG64 key schedules) and the
era and block shuffles built on them. Re-exported by ``meshbatch.kernels``."""
