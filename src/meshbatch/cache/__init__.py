"""Host-side token caches: Levanter's on-disk format, read coalesced and written resumably."""
