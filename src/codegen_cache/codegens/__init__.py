"""Built-in device codegens for the stock TVM target kinds, one module per family.

Each family module defines `CODEGENS` ({target kind: [DeviceCodegen, ...]}) and registers
nothing when imported: a registry adds a kind's built-ins itself on the kind's first use, after
the user's lazy path for that kind, skipping names already taken (DeviceCodegenRegistry.
register_builtin_family). They are kept apart from the user-visible lazy slot (one path per kind,
replaced by a later register_lazy_device_codegen), so a user's path never removes a built-in.
"""

from __future__ import annotations

from .._registry import DeviceCodegenRegistry

__all__ = ["BUILTIN_FAMILIES", "install_builtins"]

# target kind -> module whose CODEGENS[kind] are that kind's built-in codegens
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


def install_builtins(registry: DeviceCodegenRegistry) -> None:
    """Give `registry` every built-in family (loaded per kind on its first use)."""
    for kind, module in BUILTIN_FAMILIES.items():
        registry.register_builtin_family(kind, module)
