"""tilelang/rocm/codegen.py at 607a9144c (MIT, Copyright (c) Tile-AI; see __init__).

Adapted: imports, and the kind "hip" (not a target kind of apache-tvm) -> "rocm".
"""

from __future__ import annotations

from codegen_cache import DeviceCodegen, global_func_device_codegen, register_device_codegen


register_device_codegen(
    "rocm",
    DeviceCodegen(
        "hip",
        build=global_func_device_codegen("target.build.tilelang_hip"),
        build_without_compile=global_func_device_codegen("target.build.tilelang_hip_without_compile"),
    ),
    override=True,
)
