"""Mixture kernels: the stable mixture's row map (``stable_mixture``) and the token-balanced
least-consumed interleave (``interleave``). Re-exported by ``meshbatch.kernels``."""
