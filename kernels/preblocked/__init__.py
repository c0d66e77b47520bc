"""Preblocked-data kernels: the packing plan (``packing``), the structure validator and batches
read off the block markers (``structure``) and masked-LM masking (``mlm_mask``).
Re-exported by ``meshbatch.kernels``."""
