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
import threading

import xxhash

from .. import _compat
from .._artifacts._cuda import (
    CudaPayload,
    load_cuda_payload,
    module_payload,
    remember_source,
)
from .._compat import IRModule, Module, Target
from .._errors import CudaRuntimeUnavailableError, UncacheableError
from .._registry import DeviceCodegen
from ._callbacks import callback_salts, declared_salt, object_identity, tvm_name, unchanged
from ._common import env_salts

__all__ = ["CODEGENS", "build_cuda", "compile_cuda_payload", "cuda_source_module", "find_nvcc", "nvcc_path", "nvcc_version"]

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
_GET_CODEGEN = "tirx.intrinsics.cuda.get_codegen"
# TVM_COMPILE_FORCE_FALLBACK is process-wide: one thread at a time may set it.
_fallback_lock = threading.Lock()


def cuda_source_module(mod: IRModule, target: Target) -> Module:
    """CUDA source as TVM's source-only (fallback) module, never compiled."""
    build = _compat.global_func("target.build.cuda")
    if not _compat.cuda_runtime_available():
        return build(mod, target)
    with _fallback_lock:
        previous = os.environ.get("TVM_COMPILE_FORCE_FALLBACK")
        os.environ["TVM_COMPILE_FORCE_FALLBACK"] = "1"
        try:
            return build(mod, target)
        finally:
            if previous is None:
                del os.environ["TVM_COMPILE_FORCE_FALLBACK"]
            else:
                os.environ["TVM_COMPILE_FORCE_FALLBACK"] = previous


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
    return _nvcc_path(os.environ.get("CUDA_PATH"), os.environ.get("PATH"))


@functools.lru_cache(maxsize=16)
def _nvcc_path(cuda_path: str | None, path: str | None) -> str:
    # The arguments are the memo key: find_nvcc reads the same two variables.
    return find_nvcc() or "none"


def nvcc_version() -> str:
    """`nvcc --version`'s last line (the build id) for nvcc_path(), or 'none' where nvcc is not found."""
    return _version_of(nvcc_path())


@functools.lru_cache(maxsize=16)
def _version_of(nvcc: str) -> str:
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


def intrinsics_identity(get_codegen: str | None = None) -> str:
    """Identity of TVM's CUDA device-intrinsic codegen table, which target.build.cuda reads.

    'tvm' while every entry is TVM's own (the TVM version is a key part); else a digest of the
    other entries' identities (as callbacks', docs/key.md). Memoized per table size: adding an
    entry is seen at once, replacing one in place is not (declare a salt for
    tirx.intrinsics.cuda.get_codegen after doing that).
    """
    # `get_codegen`: that callback's identity when the caller has it (saves a lookup).
    if get_codegen is None:
        declared = declared_salt(_GET_CODEGEN)
        get_codegen = "" if declared is None else f"declared:{declared}"
    if get_codegen.startswith("declared:"):
        return get_codegen
    table = _intrinsic_table()
    if table is None:
        return "none"
    memo = _intrinsics_memo.get("table")
    if memo is not None and memo[0] is table and memo[1] == len(table) and unchanged(memo[4]):
        if memo[3] is not None:
            raise memo[3]
        return memo[2]
    identity, error, watch = "tvm", None, []
    digest = xxhash.xxh3_128()
    try:
        for op in sorted(table):
            func = table[op]
            if tvm_name(getattr(func, "__wrapped__", func)) is not None:
                continue  # TVM's own codegen for this op
            found, seen = object_identity(func, f"the CUDA intrinsic codegen for {op!r}", _GET_CODEGEN)
            watch += seen
            digest.update(f"{len(op)}:{op}{len(found)}:{found}".encode())
            identity = f"user:{digest.hexdigest()}"
    except UncacheableError as err:
        error = err
    _intrinsics_memo["table"] = (table, len(table), identity, error, tuple(watch))
    if error is not None:
        raise error
    return identity


_intrinsics_memo: dict[str, tuple] = {}


def _intrinsic_table() -> dict | None:
    # The dict get_codegen itself reads, from its module's globals (the module object TVM
    # exposes is a lazy proxy whose attribute access costs a microsecond).
    scope = _intrinsic_scope[0] if _intrinsic_scope else _find_intrinsic_scope()
    return None if scope is None else scope.get("CODEGEN_REGISTRY")


_intrinsic_scope: list = []


def _find_intrinsic_scope() -> dict | None:
    try:
        from tvm.backend.cuda.codegen.registry import register_codegen
    except ImportError:  # a TVM without Python-side CUDA intrinsics (tilelang's bundled one)
        scope = None
    else:
        scope = getattr(register_codegen, "__globals__", None)  # the module get_codegen reads
    _intrinsic_scope[:] = [scope]
    return scope


def _cuda_toolchain(target: Target, compile_device: bool) -> dict[str, str]:
    # Computed on every key (a few microseconds, memoized per registered function): a hook
    # registered a moment ago changes the source, so a cached answer could serve a stale entry.
    salts = callback_salts(*CALLBACKS)
    salts["cuda_intrinsics"] = intrinsics_identity(salts[f"callback:{_GET_CODEGEN}"])
    if compile_device:
        # The path as well as the build id: the headers and nvcc.profile beside it are inputs.
        salts["nvcc"] = nvcc_version()
        salts["nvcc_path"] = nvcc_path()
        salts.update(env_salts(COMPILE_ENV))
    return salts


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
