"""Preblocked-data kernels: the packing plan (``packing``), batches read off the block markers
(``block_batch``), the structure validator (``structure``) and masked-LM masking (``mlm_mask``).
Re-exported by ``meshbatch.kernels``."""
