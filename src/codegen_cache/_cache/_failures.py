"""The failure cache: a codegen error for a key is raised again without running the codegen.

Autotuners retry invalid configs; a remembered failure costs one read. The toolchain is in
the key, so a new compiler or flag tries again; entries expire after a TTL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._artifacts._codecs import frame, unframe
from .._errors import ArtifactError, CachedCodegenError, CudaRuntimeUnavailableError
from .._key import CacheKey
from .._storage._disk import ArtifactStore

__all__ = ["CACHEABLE_FAILURES", "ENVIRONMENT_FAILURES", "FailureCache"]

# Errors a codegen raises for a bad kernel or config: remembered.
CACHEABLE_FAILURES = (RuntimeError, ValueError, TypeError, AttributeError, IndexError, KeyError)
# Errors of the environment, not the kernel: never remembered.
ENVIRONMENT_FAILURES = (CudaRuntimeUnavailableError, CachedCodegenError, OSError, MemoryError)

Guard = Callable[..., Any]


class FailureCache:
    """Failures by key in their own store (`<dir>/failures`), each with an expiry."""

    def __init__(self, store: ArtifactStore, *, ttl: float, guard: Guard, count: Callable[[str], None]) -> None:
        self.store = store
        self.ttl = ttl
        self._guard = guard  # the cache's: storage errors become a logged, counted no-op
        self._count = count

    def remember(self, key: CacheKey, codegen: str, err: BaseException) -> None:
        """Keep `err` as the outcome of `key` for ttl seconds."""
        if self.ttl <= 0:
            return
        meta = {"key": key.digest, "codegen": codegen, "error_type": type(err).__name__,
                "message": str(err)[:20000], "created": time.time()}
        if self._guard("write", self.store.put, key.digest, frame("failure", meta, []), expire=self.ttl):
            self._count("failures_stored")

    def raise_if_failed(self, key: CacheKey, codegen: str) -> None:
        """Raise CachedCodegenError when `key` failed within the last ttl seconds."""
        if self.ttl <= 0:
            return
        blob = self._guard("read", self.store.get, key.digest)
        if blob is None:
            return
        try:
            meta = unframe(blob).meta
        except ArtifactError:
            self._guard("delete", self.store.delete, key.digest)
            return
        self._count("failures_served")
        raise CachedCodegenError(codegen, key.digest, str(meta.get("error_type")), str(meta.get("message")))
