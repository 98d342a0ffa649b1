"""Source-level GPU codegens of stock TVM: nvptx, opencl, metal, rocm, vulkan, webgpu.

On a machine without the vendor runtime, TVM returns a fallback module that holds the
generated source; these codegens expose that as `build_without_compile`. nvptx and rocm
compile through LLVM and need their toolkits (libdevice via CUDA_PATH, ROCm path).
"""

from __future__ import annotations

import functools
import os
import shutil

from .._compat import Target
from .._registry import DeviceCodegen, global_func_device_codegen
from ._callbacks import callback_salts

__all__ = ["CODEGENS", "cuda_root", "rocm_root"]

# The callbacks each codegen's target.build.<kind> calls (docs/key.md; tests/test_key_inputs.py
# registers a recording hook under every name and checks that nothing else is called).
CALLBACKS = {
    "nvptx": ("tvm_callback_libdevice_path",),
    "opencl": ("tvm_callback_opencl_postproc",),
    "metal": ("tvm_callback_metal_compile",),
    "rocm": ("tvm_callback_rocm_link", "tvm_callback_rocm_bitcode_path", "tvm_callback_rocm_get_arch"),
}


def cuda_root() -> str:
    """The CUDA root tvm.support.nvcc.find_cuda_path picks now (libdevice is found under it)."""
    return _root(os.environ.get("CUDA_PATH"), os.environ.get("PATH"), "nvcc", "/usr/local/cuda")


def rocm_root() -> str:
    """The ROCm root tvm.support.rocm.find_rocm_path picks now (device libraries, lld)."""
    return _root(os.environ.get("ROCM_PATH"), os.environ.get("PATH"), "hipcc", "/opt/rocm")


@functools.lru_cache(maxsize=16)
def _root(explicit: str | None, path: str | None, tool: str, default: str) -> str:
    # TVM's own rule: the variable, else the tool on PATH (../..), else the default if it has the tool.
    if explicit is not None:
        return explicit
    found = shutil.which(tool, path=path)
    if found:
        return os.path.realpath(os.path.join(found, "../.."))
    return default if os.path.exists(os.path.join(default, "bin", tool)) else "none"


def _toolchain(kind: str):
    def toolchain(target: Target, compile_device: bool) -> dict[str, str]:
        salts = callback_salts(*CALLBACKS.get(kind, ()))
        if kind == "nvptx":
            salts["cuda_root"] = cuda_root()
        elif kind == "rocm":
            salts["rocm_root"] = rocm_root()
            salts["ld.lld"] = shutil.which("ld.lld") or "none"
        return salts

    return toolchain


def _source_codegen(kind: str) -> DeviceCodegen:
    return DeviceCodegen(
        kind,
        build_without_compile=global_func_device_codegen(f"target.build.{kind}"),
        toolchain=_toolchain(kind) if kind in CALLBACKS else None,
    )


CODEGENS = {
    "nvptx": [DeviceCodegen("nvptx", build=global_func_device_codegen("target.build.nvptx"), toolchain=_toolchain("nvptx"))],
    "opencl": [_source_codegen("opencl")],
    "metal": [_source_codegen("metal")],
    "rocm": [DeviceCodegen("rocm", build=global_func_device_codegen("target.build.rocm"), toolchain=_toolchain("rocm"))],
    "vulkan": [_source_codegen("vulkan")],
    "webgpu": [_source_codegen("webgpu")],
}
