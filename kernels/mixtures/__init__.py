"""Mixture kernels: the stable mixture's row map (``stable_mixture``) and the token-balanced
least-consumed interleave (its rule, shared types and the pipeline's kernel, a tournament tree, in
``interleave_tree``). Re-exported by ``meshbatch.kernels``."""
