"""Mixture kernels: the stable mixture's row map (``stable_mixture``) and the token-balanced
least-consumed interleave, three ways to the same picks: ``interleave`` (the rule as a scan, an
argmin over every source per row), ``interleave_tree`` (a tournament tree, one climb per row: the
pipeline's) and ``interleave_merge`` (a parallel merge). Re-exported by ``meshbatch.kernels``."""
