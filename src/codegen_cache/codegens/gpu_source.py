"""Source-level GPU codegens of stock TVM: nvptx, opencl, metal, rocm, vulkan, webgpu.

On a machine without the vendor runtime, TVM returns a fallback module that holds the
generated source; these codegens expose that as `build_without_compile`. nvptx and rocm
compile through LLVM and need their toolkits (libdevice via CUDA_PATH, ROCm path).
"""

from __future__ import annotations

from tvm.target import Target

from .._registry import DeviceCodegen, global_func_device_codegen
from ._common import env_salts

__all__ = ["CODEGENS"]


def _toolchain_with_env(*names: str):
    def toolchain(target: Target, compile_device: bool) -> dict[str, str]:
        return env_salts(names)

    return toolchain


def _source_codegen(kind: str, *env: str) -> DeviceCodegen:
    return DeviceCodegen(
        kind,
        build_without_compile=global_func_device_codegen(f"target.build.{kind}"),
        toolchain=_toolchain_with_env(*env) if env else None,
    )


CODEGENS = {
    "nvptx": [
        DeviceCodegen(
            "nvptx",
            build=global_func_device_codegen("target.build.nvptx"),
            toolchain=_toolchain_with_env("CUDA_PATH"),
        )
    ],
    "opencl": [_source_codegen("opencl")],
    "metal": [_source_codegen("metal")],
    "rocm": [
        DeviceCodegen(
            "rocm",
            build=global_func_device_codegen("target.build.rocm"),
            toolchain=_toolchain_with_env("ROCM_PATH"),
        )
    ],
    "vulkan": [_source_codegen("vulkan")],
    "webgpu": [_source_codegen("webgpu")],
}
