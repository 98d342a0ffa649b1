"""CUDA codegens: source-only (TVM's fallback module) and compiled with nvcc for the target's arch.

TVM 0.27's `target.build.cuda` returns a source-only module when its CUDA runtime is not
loaded, and JIT-compiles through NVRTC when it is. The compiled codegen here always
generates source first, then compiles it with nvcc for the *target's* arch (TVM reads the
arch from Target.current(), so the compile runs inside `with target:`), and loads the binary
through TVM's CUDA loader. The compile step is callable alone (`compile_cuda_payload`), so a
GPU-less host can fill a cache for GPU hosts.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from .. import _compat
from .._artifacts._cuda import (
    CudaPayload,
    forced_fallback,
    load_cuda_payload,
    module_payload,
    remember_source,
)
from .._compat import IRModule, Module, Target
from .._errors import CudaRuntimeUnavailableError
from .._key import ToolchainParts
from .._registry import DeviceCodegen, call_codegen_function, codegen_function
from ._callbacks import callback_parts
from ._common import env_salts, env_values
from ._intrinsics import GET_CODEGEN, intrinsics_identity

__all__ = ["CODEGENS", "build_cuda", "compile_cuda_payload", "cuda_source_module", "find_nvcc", "nvcc_path", "nvcc_version",
           "nvcc_version_at"]

# Environment variables read on the compiled CUDA path: by tvm.support.nvcc.compile_cuda (nvcc
# flags, ptxas options, debug and dump modes, NVSHMEM headers) and by nvcc itself. Those it
# does not read, and why, are in _common.EXCLUDED_ENV.
COMPILE_ENV = (
    "TVM_CUDA_PTXAS_REG_LEVEL",
    "TVM_CUDA_PTXAS_EXTRA_OPTS",
    "TVM_CUDA_NVCC_NO_FAST_MATH",
    "TVM_KERNEL_DEBUG",
    "TVM_KERNEL_DUMP",
    "NVSHMEM_HOME",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN",
)
# Callbacks target.build.cuda calls on the way the built-in codegens use it (both modes: the
# compiled one generates its source the same way). tvm_callback_cuda_compile is never reached.
CALLBACKS = (
    "tvm_callback_cuda_postproc",
    "tvm.support.nvcc.get_compute_version",
    "tirx.intrinsics.cuda.get_codegen",
    "tirx.intrinsics.cuda.header_generator",
)
def cuda_source_module(mod: IRModule, target: Target) -> Module:
    """CUDA source as TVM's source-only (fallback) module, never compiled."""
    build = codegen_function("target.build.cuda")
    if not _compat.cuda_runtime_available():
        return call_codegen_function("target.build.cuda", build, mod, target)
    with forced_fallback():  # TVM_COMPILE_FORCE_FALLBACK is process-wide: one thread at a time
        return call_codegen_function("target.build.cuda", build, mod, target)


def find_nvcc() -> str | None:
    """Path of nvcc: CUDA_PATH/bin, PATH, or the nvidia-cuda-nvcc wheel."""
    candidates = []
    if os.environ.get("CUDA_PATH"):
        candidates.append(os.path.join(os.environ["CUDA_PATH"], "bin", "nvcc"))
    found = shutil.which("nvcc")
    if found:
        candidates.append(found)
    try:
        import nvidia.cuda_nvcc as wheel  # type: ignore[import-not-found]

        candidates.extend(os.path.join(p, "bin", "nvcc") for p in wheel.__path__)
    except ImportError:
        pass
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def nvcc_path() -> str:
    """The nvcc compiled CUDA runs now (find_nvcc, memoized per CUDA_PATH and PATH), or 'none'."""
    return _nvcc_path(env_values(_NVCC_ENV))


_NVCC_ENV = ("CUDA_PATH", "PATH")


@functools.lru_cache(maxsize=16)
def _nvcc_path(values: tuple[object, ...]) -> str:
    # The raw values of the two variables find_nvcc reads are the memo key.
    return find_nvcc() or "none"


def nvcc_version() -> str:
    """`nvcc --version`'s last line (the build id) for nvcc_path(), or 'none' where nvcc is not found."""
    return nvcc_version_at(nvcc_path())


@functools.lru_cache(maxsize=16)
def nvcc_version_at(nvcc: str) -> str:
    """`nvcc --version`'s last line for the nvcc at this path ('none', 'unusable' or 'unknown' otherwise)."""
    if nvcc == "none":
        return "none"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unusable"
    lines = out.stdout.strip().splitlines()
    return lines[-1] if lines else "unknown"


def compile_cuda_payload(mod: IRModule, target: Target) -> tuple[CudaPayload, str]:
    """Generate CUDA source and compile it with nvcc for the target's arch (no driver needed)."""
    from tvm.support import nvcc as tvm_nvcc

    source = cuda_source_module(mod, target)
    text = source.inspect_source("cuda") or source.inspect_source("")
    fmap = module_payload(source).fmap
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError(
            "nvcc was not found (looked in CUDA_PATH/bin, PATH and the nvidia-cuda-nvcc wheel); "
            "install the CUDA toolkit or `pip install tvm-codegen-cache[cuda]`"
        )
    # tvm.support.nvcc runs "nvcc" from PATH; make sure it is the one we found.
    nvcc_dir = os.path.dirname(nvcc)
    if shutil.which("nvcc") != nvcc:
        os.environ["PATH"] = nvcc_dir + os.pathsep + os.environ.get("PATH", "")
    with target:
        binary = tvm_nvcc.compile_cuda(text, target_format="fatbin", compiler="nvcc")
    payload = CudaPayload("fatbin", fmap, bytes(binary))
    remember_source(payload.code, text)
    return payload, text


def build_cuda(mod: IRModule, target: Target) -> Module:
    """Compiled CUDA module: nvcc for the target's arch, loaded through TVM's CUDA runtime."""
    if not _compat.cuda_runtime_available():
        raise CudaRuntimeUnavailableError("build a compiled CUDA module")
    payload, _source = compile_cuda_payload(mod, target)
    return load_cuda_payload(payload)


def _cuda_toolchain(target: Target, compile_device: bool) -> ToolchainParts:
    # Checked on every key: a hook registered a moment ago changes the source, so a cached
    # answer could serve a stale entry. The answer is memoized per mode and reused while its
    # inputs are the same: the callbacks' parts (the same tuple object while every function is
    # the one they were computed from, callback_parts), the intrinsic table's identity, and
    # for the compiled mode the nvcc found (path and build id, each memoized by what selects
    # it) and the raw values of the variables nvcc reads; compute_key then reuses the encoded
    # key tail as well.
    callbacks = callback_parts(CALLBACKS)
    intrinsics = intrinsics_identity(callbacks[_GET_CODEGEN_AT][1])
    # The path as well as the build id: the headers and nvcc.profile beside it are inputs.
    compiler = (nvcc_path(), nvcc_version(), env_values(COMPILE_ENV)) if compile_device else None
    memo = _toolchain_memo.get(compile_device)
    if memo is not None and memo[0] is callbacks and memo[1] == intrinsics and memo[2] == compiler:
        return memo[3]
    salts = dict(callbacks)
    salts["cuda_intrinsics"] = intrinsics
    if compiler is not None:
        salts["nvcc"] = compiler[1]
        salts["nvcc_path"] = compiler[0]
        salts.update(env_salts(COMPILE_ENV))
    parts = ToolchainParts(salts)
    _toolchain_memo[compile_device] = (callbacks, intrinsics, compiler, parts)
    return parts


_GET_CODEGEN_AT = CALLBACKS.index(GET_CODEGEN)
# compile_device -> (callback parts, intrinsics identity, (nvcc path, build id, raw env values), the part)
_toolchain_memo: dict[bool, tuple] = {}


CODEGENS = {
    "cuda": [
        DeviceCodegen(
            "cuda",
            build=build_cuda,
            build_without_compile=cuda_source_module,
            toolchain=_cuda_toolchain,
        )
    ]
}
