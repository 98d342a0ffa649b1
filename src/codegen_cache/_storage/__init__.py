"""Storage under the cache: diskcache stores, the memory tier, the remote tier, locks, filesystem checks."""
