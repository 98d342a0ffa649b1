"""CPU codegens: llvm (compiled JIT module, or LLVM IR text) and c (C source)."""

from __future__ import annotations

import functools

from .._compat import IRModule, Module, Target, tvm
from .._registry import DeviceCodegen, global_func_device_codegen

__all__ = ["CODEGENS", "llvm_ir_source"]

_build_llvm = global_func_device_codegen("target.build.llvm")


def llvm_ir_source(mod: IRModule, target: Target) -> Module:
    """LLVM IR text of the module as a source module (format 'll'): llvm without compilation."""
    return tvm.get_global_func("runtime.SourceModuleCreate")(_build_llvm(mod, target).inspect_source("ll"), "ll")


@functools.lru_cache(maxsize=1)
def _llvm_salts() -> dict[str, str]:
    return {"llvm_version": str(tvm.target.codegen.llvm_version_major())}


def _llvm_toolchain(target: Target, compile_device: bool) -> dict[str, str]:
    return _llvm_salts()


CODEGENS = {
    "llvm": [
        DeviceCodegen(
            "llvm",
            build=_build_llvm,
            build_without_compile=llvm_ir_source,
            toolchain=_llvm_toolchain,
        )
    ],
    "c": [DeviceCodegen("c", build_without_compile=global_func_device_codegen("target.build.c"))],
}
