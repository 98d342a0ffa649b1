"""Every exception this package raises on purpose, each owning its message."""

from __future__ import annotations

import errno
import os

__all__ = [
    "ArtifactError",
    "CachedCodegenError",
    "CodegenCacheError",
    "CommandError",
    "ConfigError",
    "CudaRuntimeUnavailableError",
    "KernelSourceError",
    "LoweringError",
    "ReadOnlyStoreError",
    "RemoteRefusedError",
    "RemoteReplyError",
    "RemoteValueTooLargeError",
    "UncacheableError",
    "UnsafeEntryError",
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


class ConfigError(CodegenCacheError, ValueError):
    """A setting (argument or environment variable) has a value that is not accepted."""

    def __init__(self, name: str, value: object, accepted: str) -> None:
        super().__init__(name, value, accepted)
        self.name = name
        self.value = value
        self.accepted = accepted

    def __str__(self) -> str:
        return f"invalid value {self.value!r} for {self.name}: expected {self.accepted}"


class LoweringError(CodegenCacheError, ValueError):
    """A kernel cannot be turned into the device module a codegen expects."""


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


class UnsafeEntryError(ArtifactError):
    """A row or file in a store that the cache did not write (it would need unpickling, or is not a file)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, kind="store row")

    def __reduce__(self):
        return (UnsafeEntryError, (self.reason,))


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
    """A codegen reads an input the key cannot hold (e.g. a callback with no trustworthy identity).

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
