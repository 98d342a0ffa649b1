"""The failure cache: a codegen error for a key is raised again without running the codegen.

Autotuners retry invalid configs; a remembered failure costs one read. The toolchain is in
the key, so a new compiler or flag tries again; entries expire after a TTL. With verify=True a
failure is kept with the IRModule's exact digest and served only to the same IRModule, as hits
are: a structural-hash collision never raises another kernel's error.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .._artifacts import frame, unframe
from .._errors import ArtifactError, CachedCodegenError, CudaRuntimeUnavailableError
from .._storage._disk import ArtifactStore
from ._guard import StorageGuard

__all__ = ["CACHEABLE_FAILURES", "ENVIRONMENT_FAILURES", "FailureCache"]

# Errors a codegen raises for a bad kernel or config: remembered.
CACHEABLE_FAILURES = (RuntimeError, ValueError, TypeError, AttributeError, IndexError, KeyError)
# Errors of the environment, not the kernel: never remembered.
ENVIRONMENT_FAILURES = (CudaRuntimeUnavailableError, CachedCodegenError, OSError, MemoryError)


class FailureCache:
    """Failures by key in their own store (`<dir>/failures`), each with an expiry."""

    def __init__(self, store: ArtifactStore, *, ttl: float, guard: StorageGuard, count: Callable[[str], None]) -> None:
        self.store = store
        self.ttl = ttl
        self._guard = guard
        self._count = count

    def remember(self, digest: str, codegen: str, err: BaseException, *, ir_digest: str | None = None) -> None:
        """Keep `err` as the outcome of `digest` for ttl seconds (for `ir_digest` only, when given)."""
        if self.ttl <= 0:
            return
        meta = {"key": digest, "codegen": codegen, "error_type": type(err).__name__,
                "message": str(err)[:20000], "created": time.time()}
        if ir_digest is not None:
            meta["ir_digest"] = ir_digest
        if self._guard("write", self.store.put, digest, frame("failure", meta, []), expire=self.ttl):
            self._count("failures_stored")

    def raise_if_failed(self, digest: str, codegen: str, *, ir_digest: Callable[[], str] | None = None) -> None:
        """Raise CachedCodegenError when `digest` failed within the last ttl seconds.

        With `ir_digest` (verify=True), only a failure recorded for that exact IRModule counts.
        """
        if self.ttl <= 0:
            return
        blob = self._guard("read", self.store.get, digest)
        if blob is None:
            return
        try:
            meta = unframe(blob).meta
        except ArtifactError:
            self._guard("delete", self.store.delete, digest)
            return
        if ir_digest is not None and meta.get("ir_digest") != ir_digest():
            return  # another IRModule's failure (a hash collision), or recorded without verify
        self._count("failures_served")
        raise CachedCodegenError(codegen, digest, str(meta.get("error_type")), str(meta.get("message")))
