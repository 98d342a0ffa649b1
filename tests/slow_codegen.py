"""A slow codegen for multi-process tests: sleeps, logs each call to a file, then builds llvm.

Importable by spawned children (it lives in tests/, which conftest puts on sys.path).
"""

from __future__ import annotations

import os
import time

from codegen_cache import DeviceCodegen, global_func_device_codegen

_llvm = global_func_device_codegen("target.build.llvm")


def _slow_build(mod, target):
    log = os.environ.get("SLOW_CODEGEN_LOG")
    name = next(iter(mod.functions)).name_hint
    if log:
        with open(log, "a") as f:  # O_APPEND: one short line per call, atomic enough
            f.write(f"{os.getpid()} {name}\n")
    time.sleep(float(os.environ.get("SLOW_CODEGEN_SECONDS", "0.3")))
    if os.environ.get("SLOW_CODEGEN_FAIL") == name:
        raise ValueError(f"invalid config {name}")
    return _llvm(mod, target)


SLOW_LLVM = DeviceCodegen("slow-llvm", build=_slow_build, build_without_compile=_slow_build)
