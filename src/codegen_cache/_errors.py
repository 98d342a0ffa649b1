"""Every exception this package raises on purpose, each owning its message; which of a codegen's are remembered."""

from __future__ import annotations

import errno
import os

__all__ = [
    "CACHEABLE_FAILURES",
    "ENVIRONMENT_FAILURES",
    "ArtifactError",
    "CacheLinkError",
    "CachedCodegenError",
    "CodegenCacheError",
    "CommandError",
    "ConfigError",
    "ExportError",
    "CudaRuntimeUnavailableError",
    "EntryKeyError",
    "KernelSourceError",
    "ReadOnlyStoreError",
    "PrepareError",
    "ReentrantLoweringError",
    "RemoteRefusedError",
    "RemoteReplyError",
    "RemoteValueTooLargeError",
    "UncacheableError",
    "UnsafeEntryError",
    "remembered_error",
]


class CodegenCacheError(Exception):
    """Base class of the errors raised by codegen_cache."""


class ArtifactError(CodegenCacheError, ValueError):
    """Bytes read from a cache are not a valid artifact (bad framing, checksum or payload)."""

    def __init__(self, reason: str, *, kind: str | None = None) -> None:
        super().__init__(reason, kind)
        self.reason = reason
        self.kind = kind

    def __str__(self) -> str:
        where = f" ({self.kind} artifact)" if self.kind else ""
        return f"malformed cache artifact{where}: {self.reason}"

    def __reduce__(self):
        return (_rebuild_artifact_error, (self.reason, self.kind))


def _rebuild_artifact_error(reason: str, kind: str | None) -> ArtifactError:
    return ArtifactError(reason, kind=kind)


class EntryKeyError(ArtifactError):
    """A well-framed entry whose metadata names another key than the one it is stored under."""

    def __init__(self, expected: str, found: object, kind: str | None = None) -> None:
        super().__init__(f"stored under key {expected[:16]}, its metadata names key {str(found)[:16]}", kind=kind)
        self.expected = expected
        self.found = found

    def __reduce__(self):
        return (EntryKeyError, (self.expected, self.found, self.kind))


class ConfigError(CodegenCacheError, ValueError):
    """A setting (argument or environment variable) has a value that is not accepted."""

    def __init__(self, name: str, value: object, accepted: str) -> None:
        super().__init__(name, value, accepted)
        self.name = name
        self.value = value
        self.accepted = accepted

    def __str__(self) -> str:
        return f"invalid value {self.value!r} for {self.name}: expected {self.accepted}"


class PrepareError(CodegenCacheError, ValueError):
    """A kernel cannot be prepared into the device module a codegen expects."""


class CudaRuntimeUnavailableError(CodegenCacheError, RuntimeError):
    """A compiled CUDA module was asked for where TVM's CUDA runtime is not loaded."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what

    def __str__(self) -> str:
        return (
            f"cannot {self.what}: TVM's CUDA runtime is not loaded in this process "
            "(no libcuda.so.1 / GPU driver was found when tvm was imported). "
            "Use compile_device=False for CUDA source, or "
            "codegen_cache.codegens.cuda.compile_cuda_payload() to produce the binary "
            "for a GPU host without loading it."
        )

    def __reduce__(self):
        return (CudaRuntimeUnavailableError, (self.what,))


class CachedCodegenError(CodegenCacheError, RuntimeError):
    """A codegen failed for this key before; the failure was served from the failure cache."""

    def __init__(self, codegen: str, key: str, error_type: str, message: str) -> None:
        super().__init__(codegen, key, error_type, message)
        self.codegen = codegen
        self.key = key
        self.error_type = error_type
        self.message = message

    def __str__(self) -> str:
        return (
            f"device codegen {self.codegen!r} failed earlier for key {self.key[:16]} "
            f"(cached failure; clear it with `codegen-cache clear --failures`): "
            f"{self.error_type}: {self.message}"
        )

    def __reduce__(self):
        return (CachedCodegenError, (self.codegen, self.key, self.error_type, self.message))


# A remembered failure is raised as the class the codegen raised (tvm.error.InternalError, a
# ValueError, ...) so that `except` clauses written for the codegen catch it, warm or cold. The
# class raised is made once per original class: a subclass of both the original and
# CachedCodegenError (so `except CachedCodegenError` still tells a remembered failure apart).
_REMEMBERED: dict[type, type] = {}


def _remembered_init(self, codegen: str, key: str, error_type: str, message: str) -> None:
    BaseException.__init__(self, message)  # args as the codegen's own error has them: (message,)
    self.codegen = codegen
    self.key = key
    self.error_type = error_type
    self.message = message


def _remembered_str(self) -> str:
    # The codegen's message first, as a cold run prints it; then where this one came from.
    return (f"{self.message}\n(remembered by the codegen cache: device codegen {self.codegen!r} failed "
            f"with this {self.error_type} for key {self.key[:16]}; clear it with `codegen-cache clear --failures`)")


def _remembered_reduce(self):
    return (remembered_error, (type(self).__bases__[0], self.codegen, self.key, self.error_type, self.message))


def remembered_error(original: type, codegen: str, key: str, error_type: str, message: str) -> CachedCodegenError:
    """The error a remembered failure of class `original` is raised as: an instance of both.

    Where no such class can be made (an exception class that refuses subclasses), a plain
    CachedCodegenError naming the original type.
    """
    made = _REMEMBERED.get(original)
    if made is None:
        try:
            made = type(original.__name__, (original, CachedCodegenError), {
                "__module__": original.__module__, "__qualname__": original.__qualname__,
                "__doc__": f"A remembered {original.__name__} of a device codegen (see CachedCodegenError).",
                "__init__": _remembered_init, "__str__": _remembered_str, "__reduce__": _remembered_reduce,
            })
        except TypeError:  # final classes, incompatible layouts
            made = CachedCodegenError
        _REMEMBERED[original] = made
    return made(codegen, key, error_type, message)


class ExportError(CodegenCacheError, RuntimeError):
    """A module tree holding a cached llvm library cannot be exported: a node of it cannot be copied."""

    def __init__(self, kind: str, reason: str = "") -> None:
        super().__init__(kind, reason)
        self.kind = kind
        self.reason = reason

    def __str__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return (f"cannot export a {self.kind!r} module that imports a cached llvm library: it cannot be copied "
                f"to import the library's llvm module in its place{why}; build it inside "
                "`with codegen_cache.use_cache(None):` to export it")

    def __reduce__(self):
        return (ExportError, (self.kind, self.reason))


class ReentrantLoweringError(CodegenCacheError, RecursionError):
    """A codegen asked the cache for the key its own thread is building (it would wait on itself).

    A RecursionError, which is what the same codegen raises without a cache.
    """

    def __init__(self, codegen: str, key: str) -> None:
        super().__init__(codegen, key)
        self.codegen = codegen
        self.key = key

    def __str__(self) -> str:
        return (f"device codegen {self.codegen!r} re-entered the codegen cache for key {self.key[:16]}, which "
                "this thread is building: the codegen lowers its own input again (e.g. an override of "
                "target.build.<kind> that calls resolve_device_codegen(target).lower(...)); call the "
                "original codegen function instead, or lower inside `with codegen_cache.use_cache(None):`")

    def __reduce__(self):
        return (ReentrantLoweringError, (self.codegen, self.key))


class UnsafeEntryError(ArtifactError):
    """A row or file in a store that the cache did not write (it would need unpickling, or is not a file)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, kind="store row")

    def __reduce__(self):
        return (UnsafeEntryError, (self.reason,))


class CacheLinkError(CodegenCacheError, OSError):
    """A symlink (or a file) where a directory of the cache belongs: never followed (warned once)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(errno.ENOTDIR, "not a directory of the cache (a symlink?)", os.fspath(path))

    def __reduce__(self):
        return (CacheLinkError, (self.filename,))


class ReadOnlyStoreError(CodegenCacheError, OSError):
    """A write to a store whose directory cannot be written (read-only mount, no permission)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        super().__init__(errno.EROFS, "cache store is read-only", os.fspath(directory))

    def __reduce__(self):
        return (ReadOnlyStoreError, (self.filename,))


class KernelSourceError(CodegenCacheError, ValueError):
    """A kernels file or module cannot be loaded, or does not expose kernels."""


class CommandError(CodegenCacheError):
    """A command cannot do what was asked; its message is printed and `code` returned."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message, code)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (CommandError, (self.message, self.code))


class UncacheableError(CodegenCacheError):
    """A codegen reads an input the key cannot hold (e.g. a user's callback without a declared salt).

    Raised by a codegen's toolchain function; the cache then runs the codegen without storing
    or serving anything, counts the lowering as uncacheable and warns once per input.
    """

    def __init__(self, what: str, reason: str, remedy: str) -> None:
        super().__init__(what, reason, remedy)
        self.what = what
        self.reason = reason
        self.remedy = remedy

    def __str__(self) -> str:
        return f"{self.what} cannot be keyed ({self.reason}); {self.remedy}"

    def __reduce__(self):
        return (UncacheableError, (self.what, self.reason, self.remedy))


class RemoteReplyError(CodegenCacheError, ConnectionError):
    """A remote server's reply is not what the command expects (malformed, wrong type, an error reply).

    A ConnectionError, so the remote tier handles it like any other broken connection: the
    connection is dropped and the call is a miss.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"bad reply from the remote server: {self.reason}"

    def __reduce__(self):
        return (type(self), (self.reason,))


class RemoteRefusedError(RemoteReplyError):
    """A remote server answered a command with an error reply (READONLY, OOM, NOPERM, NOSCRIPT, ...)."""

    def __init__(self, command: str, message: str) -> None:
        super().__init__(f"{command} answered with the error {message!r}")
        self.command = command
        self.message = message

    @property
    def code(self) -> str:
        """The error's first word, as Redis writes it (READONLY, OOM, ERR, ...)."""
        return self.message.split(" ", 1)[0]

    def __reduce__(self):
        return (RemoteRefusedError, (self.command, self.message))


class RemoteValueTooLargeError(RemoteReplyError):
    """A remote value announced as larger than the entry size cap; it was not read."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a value of {size} bytes is over the cap of {limit} bytes (not read)")
        self.size = size
        self.limit = limit

    def __reduce__(self):
        return (RemoteValueTooLargeError, (self.size, self.limit))


# What a codegen raises, sorted (the cache's miss and its failures store, _cache/_failures.py):
# errors of a bad kernel or config are remembered; errors of the environment, not the kernel,
# never are. A RecursionError depends on how deep the caller's stack was (and a re-entered cache
# raises one, ReentrantLoweringError).
CACHEABLE_FAILURES = (RuntimeError, ValueError, TypeError, AttributeError, IndexError, KeyError)
ENVIRONMENT_FAILURES = (CudaRuntimeUnavailableError, CachedCodegenError, RecursionError, OSError, MemoryError)
