"""The failure cache: a codegen error for a key is raised again without running the codegen.

Autotuners retry invalid configs; a remembered failure costs one read. The toolchain is in
the key, so a new compiler or flag tries again; entries expire after a TTL. With verify=True a
failure is kept with the IRModule's exact digest and served only to the same IRModule, as hits
are: a structural-hash collision never raises another kernel's error.

Most directories never see a failure, and a miss should not pay a SQLite read for one: the
first failure remembered in a store makes a marker file inside it (`MARKER`, before the
entry is written), and a lookup reads the store only once the marker exists (one stat, until
this process has seen it once). The marker lives and goes with the store's directory; a
failure that is not found is only a codegen run again.

Only what the codegen will raise again for the same inputs is remembered: a failure of the
environment (a toolchain or path not found, a library that cannot be loaded, a permission, a
device or driver missing) goes away once the user fixes it, and nothing of the environment is
in the key. `from_environment` tells them apart by the exception and its causes (an OSError, as a
missing file or tool gives) and by the messages TVM's tool finders write (`Cannot find ROCm path`,
`cannot find clang`, `... not found`). Where it errs, it errs towards running the codegen again.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable

from .. import _compat
from .._artifacts import frame, unframe
from .._errors import ArtifactError, CachedCodegenError, remembered_error
from .._storage._disk import ArtifactStore
from .._storage._faults import FILE_MODE, ensure_dir, share_file_mode
from ._guard import StorageGuard

__all__ = ["MARKER", "FailureCache", "from_environment"]

MARKER = ".remembered"  # in the failures store's directory, once a failure was written there

# What TVM's tool and library finders (tvm.support.nvcc, rocm, clang, cc; the runtime's loaders) and
# the operating system say when something of the environment is missing.
_ENVIRONMENT_MESSAGE = re.compile(
    r"\b(cannot|can't|could not|couldn't|unable to|failed to) (find|locate|load|open|dlopen|execute|exec|run)\b"
    r"|\bnot found\b|no such file or directory|shared object|error while loading shared libraries"
    r"|undefined symbol|permission denied|read-only file system|no space left on device|\bnot installed\b"
    r"|\b(cuda|rocm|llvm|vulkan)_(path|home)\b|no cuda-capable device|cuda driver|cuda_error_no_device",
    re.IGNORECASE)
_CAUSES_LOOKED_AT = 8  # links of __cause__ / __context__ followed, at most


def from_environment(err: BaseException) -> bool:
    """Whether `err` says something of the environment failed (not the codegen given its inputs)."""
    seen: BaseException | None = err
    for _ in range(_CAUSES_LOOKED_AT):
        if seen is None:
            break
        if isinstance(seen, (OSError, MemoryError)) or _ENVIRONMENT_MESSAGE.search(str(seen)[:4000]):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class FailureCache:
    """Failures by key in their own store (`<dir>/failures`), each with an expiry."""

    def __init__(self, store: ArtifactStore, *, ttl: float, guard: StorageGuard, count: Callable[[str], None]) -> None:
        self.store = store
        self.ttl = ttl
        self._guard = guard
        self._count = count
        self._marker = os.path.join(str(store.directory), MARKER)
        self._seen = False  # the marker was found once: from then on every lookup reads the store

    def remember(self, digest: str, codegen: str, err: BaseException, *, ir_digest: str | None = None) -> None:
        """Keep `err` as the outcome of `digest` for ttl seconds (for `ir_digest` only, when given); a failure
        of the environment (from_environment) is not kept."""
        if self.ttl <= 0 or from_environment(err):
            return
        meta = {"key": digest, "codegen": codegen, "error_type": type(err).__name__,
                "message": str(err)[:20000], "created": time.time()}
        identity = _compat.error_identity(type(err))
        if identity is not None:
            meta["error_class"] = identity  # raised as this class again (a builtin or TVM's own)
        if ir_digest is not None:
            meta["ir_digest"] = ir_digest
        self._mark()
        if self._guard("write", self.store.put, digest, frame("failure", meta, []), expire=self.ttl):
            self._count("failures_stored")

    def raise_if_failed(self, digest: str, codegen: str, *, ir_digest: Callable[[], str] | None = None) -> None:
        """Raise the remembered failure when `digest` failed within the last ttl seconds.

        It is raised as the class the codegen raised (a builtin or a TVM error class) that is
        also a CachedCodegenError; a class that cannot be named safely gives a CachedCodegenError.

        With `ir_digest` (verify=True), only a failure recorded for that exact IRModule counts.
        """
        if self.ttl <= 0:
            return
        if not self._seen:
            if not os.path.exists(self._marker):
                return  # no failure was ever written to this store
            self._seen = True
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
        error_type, message = str(meta.get("error_type")), str(meta.get("message"))
        original = _compat.error_class(meta.get("error_class"))
        if original is None:
            raise CachedCodegenError(codegen, digest, error_type, message)
        raise remembered_error(original, codegen, digest, error_type, message)

    def _mark(self) -> None:
        # Before the entry, every time (the directory may have been made anew since): a reader
        # that finds the entry has found the marker first.
        with contextlib.suppress(OSError):  # then no lookup reads it: the codegen runs (and fails) again
            ensure_dir(self.store.directory, self.store.root)
            os.close(os.open(self._marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE))
            share_file_mode(self._marker)
            self._seen = True
