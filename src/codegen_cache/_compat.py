"""Every TVM call the package makes that differs between TVM distributions, in one place.

The package runs on apache-tvm 0.27 and on the TVM that tilelang bundles; names that moved
between them (tvm.tir / tvm.tirx, tvm.ir.structural_hash / tvm_ffi.structural_hash) are
resolved here once, so the rest of the package asks this module and never probes TVM itself.
"""

from __future__ import annotations

import functools
from typing import Any

import tvm

__all__ = [
    "builtin_func",
    "cuda_runtime_available",
    "ffi_version",
    "global_func",
    "llvm_version_major",
    "runtime_enabled",
    "save_json",
    "structural_equal",
    "structural_hash",
    "tvm_version",
]

try:
    import tvm_ffi as _ffi

    _hash = _ffi.structural_hash
    _equal = _ffi.structural_equal
except (ImportError, AttributeError):  # older TVMs keep them under tvm.ir
    _hash = tvm.ir.structural_hash
    _equal = tvm.ir.structural_equal


def structural_hash(obj: Any) -> int:
    """Structural hash with free variables mapped (stable across lowerings of a CPU module)."""
    # map_free_vars=False gives a different hash on every lowering of a CPU module: its
    # storage_alignment attributes refer to buffers that compare by identity.
    return _hash(obj, map_free_vars=True)


def structural_equal(a: Any, b: Any) -> bool:
    """Structural equality with free variables mapped, as the hash."""
    return bool(_equal(a, b, map_free_vars=True))


def global_func(name: str, *, missing_ok: bool = False):
    """The TVM global function `name` as registered now (None if missing and missing_ok)."""
    return tvm.get_global_func(name, allow_missing=missing_ok)


@functools.lru_cache(maxsize=None)
def builtin_func(name: str):
    """A global function TVM registers at import and never replaces (loaders, constructors)."""
    return tvm.get_global_func(name)


def cuda_runtime_available() -> bool:
    """True when TVM's CUDA runtime (and so a CUDA driver library) is loaded in this process."""
    return global_func("ffi.Module.load_from_bytes.cuda", missing_ok=True) is not None


@functools.lru_cache(maxsize=64)
def runtime_enabled(kind: str) -> bool:
    """Whether TVM's runtime for `kind` is loaded here (fixed for the life of the process)."""
    try:
        return bool(tvm.runtime.enabled(kind))
    except (RuntimeError, ValueError):  # kinds TVM has no optional runtime for (c, webgpu)
        return False


@functools.lru_cache(maxsize=1)
def tvm_version() -> str:
    """TVM's version and commit id ('unknown' where the build does not record it)."""
    try:
        from tvm import _version

        commit = getattr(_version, "commit_id", None)
    except ImportError:  # tilelang's bundled TVM has no _version module
        commit = None
    return f"{tvm.__version__}+{commit or 'unknown'}"


@functools.lru_cache(maxsize=1)
def ffi_version() -> str:
    """The tvm-ffi version ('none' for a TVM without the separate FFI package)."""
    try:
        import tvm_ffi

        return str(tvm_ffi.__version__)
    except (ImportError, AttributeError):
        return "none"


@functools.lru_cache(maxsize=1)
def llvm_version_major() -> str:
    """The LLVM major version TVM was built with, or 'none'."""
    try:
        return str(tvm.target.codegen.llvm_version_major())
    except (AttributeError, RuntimeError, ValueError):
        return "none"


def save_json(obj: Any) -> str:
    """TVM's JSON serialization of an object (exact, slow: 20x the structural hash)."""
    return tvm.ir.save_json(obj)
