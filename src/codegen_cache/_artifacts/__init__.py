"""Artifact bytes: the frame, one codec per module kind, the CUDA payload; nothing here pickles.

The frame (`_frame`) and the scratch-name rule (`_private`) are imported with the package; the
codecs and the module classes (`_codecs`, `_cuda`, `_llvm`, `_module_methods`: they import TVM)
on the first use of one of their names, so that reading a cache directory's frames (codegen-cache ls, stats) needs
no TVM. Modules that are imported without TVM call them as `_artifacts.<name>(...)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from ._frame import CODEC_FIELDS, FORMAT_VERSION, HOT_META, Artifact, check, frame, read_meta, unframe
from ._packed import compact
from ._private import SCRATCH_PREFIX

if TYPE_CHECKING:
    from ._codecs import (CODECS, decode, encode_cuda_binary, function_names, needs_upgrade, portable, prepare,
                          symbol_names, upgradable)
    from ._link import compiler_command, upgrade
    from ._cuda import CudaPayload
    from ._llvm import CachedIRModule, CachedLibraryModule, keep_answering
    from ._as_built import library_record
    from ._module_methods import as_built_root, install_on_module, installed_on_module, own_root, uninstall_from_module

__all__ = [
    "CODECS",
    "CODEC_FIELDS",
    "FORMAT_VERSION",
    "HOT_META",
    "SCRATCH_PREFIX",
    "Artifact",
    "as_built_root",
    "CachedIRModule",
    "CachedLibraryModule",
    "CudaPayload",
    "check",
    "compact",
    "compiler_command",
    "decode",
    "encode",
    "encode_cuda_binary",
    "frame",
    "function_names",
    "install_on_module",
    "installed_on_module",
    "keep_answering",
    "library_record",
    "needs_upgrade",
    "own_root",
    "portable",
    "prepare",
    "read_meta",
    "symbol_names",
    "unframe",
    "uninstall_from_module",
    "upgradable",
    "upgrade",
]

# name -> the module that defines it, imported on the first use of the name.
_LAZY = {
    **dict.fromkeys(("CODECS", "decode", "encode_cuda_binary", "function_names", "needs_upgrade", "portable",
                     "prepare", "symbol_names", "upgradable"), "._codecs"),
    **dict.fromkeys(("compiler_command", "upgrade"), "._link"),
    "CudaPayload": "._cuda",
    **dict.fromkeys(("CachedIRModule", "CachedLibraryModule", "keep_answering"), "._llvm"),
    **dict.fromkeys(("as_built_root", "install_on_module", "installed_on_module", "own_root", "uninstall_from_module"),
                    "._module_methods"),
    "library_record": "._as_built",
}

__getattr__ = lazy_names(__name__, _LAZY, globals())


def encode(module, meta, *, func_names) -> bytes:
    """Frame a built module in its raw form (what the cache stores first)."""
    from ._codecs import prepare

    return frame(*prepare(module, meta, func_names=func_names))
