"""A stub CUDA driver (libcuda.so.1) built with gcc: every call reports 'no device'.

With it on LD_LIBRARY_PATH, TVM loads its CUDA runtime, so the load-from-bytes path of
compiled CUDA modules can be tested on a machine without a GPU (launching needs a real one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SYMBOLS = (
    "cuInit cuDriverGetVersion cuDeviceGet cuDeviceGetCount cuDeviceGetName cuDeviceGetAttribute "
    "cuFuncSetAttribute cuLaunchKernel cuLaunchKernelEx cuLaunchCooperativeKernel cuModuleGetFunction "
    "cuModuleGetGlobal cuModuleLoadData cuModuleUnload cuTensorMapEncodeTiled cuGetProcAddress "
    "cuGetProcAddress_v2 cuGetExportTable cuCtxGetCurrent cuCtxSetCurrent cuDevicePrimaryCtxRetain"
).split()

SOURCE = "\n".join(f"int {name}() {{ return 100; }}" for name in SYMBOLS) + """
static const char *msg = "CUDA_ERROR_NO_DEVICE";
int cuGetErrorName(int e, const char **s) { *s = msg; return 0; }
int cuGetErrorString(int e, const char **s) { *s = msg; return 0; }
"""


def build_stub(directory: Path) -> Path | None:
    """Build libcuda.so.1 into `directory`; None where gcc or libcudart is missing."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or not _has_cudart():
        return None
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / "stub.c"
    src.write_text(SOURCE)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(directory / "libcuda.so.1"), str(src)], check=True)
    return directory


def _has_cudart() -> bool:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    if "libcudart.so.13" in out:
        return True
    return any(Path(p, "libcudart.so.13").exists() for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p)
