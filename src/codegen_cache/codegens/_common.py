"""Helpers shared by the built-in codegen families, and the inputs deliberately left out of keys."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

__all__ = ["EXCLUDED_ENV", "env_salts", "env_values"]

# The dict os.environ wraps (CPython keeps it in _data, keyed by encoded names): a lookup there
# skips os.environ's per-name encode and decode, and env_values runs on every compiled CUDA key
# (what it saves: docs/maintaining.md, "What each one buys"). Where the dict is not there, the
# public os.environ.get; tests/test_private_internals.py fails if it goes or stops mirroring.
_RAW = getattr(os.environ, "_data", None)
_ENCODE = getattr(os.environ, "encodekey", None)


def env_salts(names: Iterable[str]) -> dict[str, str]:
    """The values of the environment variables a codegen reads, for its cache key."""
    names = tuple(names)
    if _RAW is None or _ENCODE is None:
        return _salts(names, tuple(map(os.environ.get, names)))
    return _salts(names, tuple(map(_RAW.get, _encoded(names))))


def env_values(names: tuple[str, ...]) -> tuple[object, ...]:
    """The raw values of these environment variables now (None where unset), for comparing."""
    if _RAW is None or _ENCODE is None:
        return tuple(map(os.environ.get, names))
    return tuple(map(_RAW.get, _encoded(names)))


@functools.lru_cache(maxsize=64)
def _encoded(names: tuple[str, ...]) -> tuple[object, ...]:
    return tuple(map(_ENCODE, names))


def _salts(names: tuple[str, ...], values: tuple[object, ...]) -> dict[str, str]:
    return dict(_salts_memo(names, values))


@functools.lru_cache(maxsize=256)
def _salts_memo(names: tuple[str, ...], values: tuple[object, ...]) -> tuple[tuple[str, str], ...]:
    # The raw values are the memo key; the decoded text is what goes into the key.
    return tuple((f"env:{name}", os.environ.get(name, "<unset>")) for name in names)


# Environment variables read by TVM's codegen libraries and by its Python support modules
# (tvm/support, tvm/target) that are NOT key parts, and why. tests/test_key_inputs.py greps
# TVM's sources and libraries and fails on a variable that is neither here nor in a key.
EXCLUDED_ENV: dict[str, str] = {
    "CUDA_PATH": "keyed by what it selects, not by value: the nvcc found (nvcc_path and nvcc build id) "
    "for compiled cuda, the CUDA root (cuda_root) for nvptx",
    "PATH": "keyed by what it selects: nvcc_path (compiled cuda), cuda_root (nvptx), rocm_root and ld.lld (rocm)",
    "ROCM_PATH": "keyed by what it selects: rocm_root (rocm)",
    "TVM_CUDA_COMPILE_MODE": "read only by tvm_callback_cuda_compile (NVRTC or nvcc), which the built-in cuda "
    "codegens never call: compiled CUDA always runs nvcc through compile_cuda(compiler='nvcc')",
    "TVM_CUDA_NVRTC_EXTRA_OPTS": "read only on the NVRTC path, which the built-in cuda codegens never take",
    "TVM_COMPILE_FORCE_FALLBACK": "chooses between a runtime module and a source-only one in target.build.*, not "
    "the generated code; the cuda source codegen sets it itself where TVM's CUDA runtime is loaded",
    "TVM_IKET_INJECTED_CHILD_ENABLE": "read by a lowering pass (LowerIket): its effect is in the IR the codegen "
    "receives, which the key hashes",
    "TVM_IKET_OFFICIAL_PROFILE": "read by a lowering pass (LowerIket): its effect is in the IR",
    "TVM_PRINT_AFTER_TIRX_DISPATCH_OPS": "debug printing in a lowering pass; changes no code",
    "TVM_S_TIR_META_SCHEDULE_CLEAR_SCREEN": "MetaSchedule's progress display; not a codegen",
    "TVM_NDK_CC": "tvm.support.ndk: Android export of a built library, after codegen",
    "TVM_WIN_CC": "tvm.support.cc: Windows host compiler for exporting a library, after codegen",
    "TVM_WIN_TARGET": "tvm.support.cc: Windows export, after codegen",
    "CXX": "tvm.support.cc and the llvm artifact's link step: the host compiler links object code the codegen "
    "already generated into a shared library (packaging, not code generation)",
    "CC": "tvm.support.cc: as CXX",
    "TVM_HOME": "tvm.support.emcc: WebAssembly export, after codegen",
    "TVM_USE_CUDA": "tvm.support.libinfo: build-info report only",
    "TVM_USE_LLVM": "tvm.support.libinfo: build-info report only",
    "TVM_USE_NCCL": "tvm.support.libinfo: build-info report only",
    "TVM_USE_NVTX": "tvm.support.libinfo: build-info report only",
    "TVM_USE_NVSHMEM": "tvm.support.libinfo: build-info report only",
}
