"""Built-in device codegens for the stock TVM target kinds, registered lazily per family."""

from __future__ import annotations

from .._registry import DeviceCodegenRegistry

__all__ = ["BUILTIN_FAMILIES", "install_lazy"]

# target kind -> module that registers its codegens when the kind is first used
BUILTIN_FAMILIES: dict[str, str] = {
    "cuda": "codegen_cache.codegens.cuda",
    "llvm": "codegen_cache.codegens.cpu",
    "c": "codegen_cache.codegens.cpu",
    "nvptx": "codegen_cache.codegens.gpu_source",
    "opencl": "codegen_cache.codegens.gpu_source",
    "metal": "codegen_cache.codegens.gpu_source",
    "rocm": "codegen_cache.codegens.gpu_source",
    "vulkan": "codegen_cache.codegens.gpu_source",
    "webgpu": "codegen_cache.codegens.gpu_source",
}


def install_lazy(registry: DeviceCodegenRegistry) -> None:
    """Register every built-in family lazily in `registry`."""
    for kind, module in BUILTIN_FAMILIES.items():
        registry.register_lazy(kind, module)
