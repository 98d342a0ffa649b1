"""Artifact bytes: the frame, one codec per module kind, the CUDA payload; nothing here pickles."""

from ._codecs import (CODECS, check, decode, encode_cuda_binary, function_names, needs_upgrade, portable, prepare,
                      symbol_names, upgradable, upgrade)
from ._cuda import CudaPayload
from . import _llvm
from ._frame import FORMAT_VERSION, HOT_META, Artifact, frame, read_meta, unframe
from ._llvm import SCRATCH_PREFIX, compiler_command, keep_answering

__all__ = [
    "CODECS",
    "FORMAT_VERSION",
    "HOT_META",
    "SCRATCH_PREFIX",
    "Artifact",
    "CachedIRModule",
    "CachedLibraryModule",
    "CudaPayload",
    "check",
    "compiler_command",
    "decode",
    "encode",
    "encode_cuda_binary",
    "frame",
    "function_names",
    "keep_answering",
    "needs_upgrade",
    "portable",
    "prepare",
    "read_meta",
    "symbol_names",
    "unframe",
    "upgradable",
    "upgrade",
]


def encode(module, meta, *, func_names) -> bytes:
    """Frame a built module in its raw form (what the cache stores first)."""
    return frame(*prepare(module, meta, func_names=func_names))


def __getattr__(name: str) -> type:
    """CachedIRModule and CachedLibraryModule: subclasses of TVM's Module, made on first use (_llvm)."""
    if name in ("CachedIRModule", "CachedLibraryModule"):
        return getattr(_llvm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
