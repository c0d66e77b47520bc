"""Mixture kernels: the stable mixture's row map (``stable_mixture``) and the token-balanced
least-consumed interleave (``interleave``: the rule as a scan; ``interleave_merge``: the same
picks as a parallel merge). Re-exported by ``meshbatch.kernels``."""
