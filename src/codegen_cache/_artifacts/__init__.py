"""Artifact bytes: the frame, one codec per module kind, the CUDA payload; nothing here pickles."""

from ._codecs import (CODECS, check, decode, encode_cuda_binary, function_names, needs_upgrade, portable, prepare,
                      symbol_names, upgradable, upgrade)
from ._cuda import CudaPayload
from ._frame import FORMAT_VERSION, HOT_META, Artifact, frame, read_meta, unframe
from ._llvm import SCRATCH_PREFIX, CachedIRModule, CachedLibraryModule, compiler_command, keep_answering
from ._module_methods import as_built_root, install_on_module, installed_on_module, uninstall_from_module

__all__ = [
    "CODECS",
    "FORMAT_VERSION",
    "HOT_META",
    "SCRATCH_PREFIX",
    "Artifact",
    "as_built_root",
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
    "install_on_module",
    "installed_on_module",
    "keep_answering",
    "needs_upgrade",
    "portable",
    "prepare",
    "read_meta",
    "symbol_names",
    "unframe",
    "uninstall_from_module",
    "upgradable",
    "upgrade",
]


def encode(module, meta, *, func_names) -> bytes:
    """Frame a built module in its raw form (what the cache stores first)."""
    return frame(*prepare(module, meta, func_names=func_names))
