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
import struct
import subprocess
import threading
from collections import OrderedDict
from dataclasses import dataclass

import tvm
from tvm.ir import IRModule
from tvm.runtime import Module
from tvm.target import Target

from .._errors import ArtifactError, CudaRuntimeUnavailableError
from .._registry import DeviceCodegen
from ._common import env_salts

__all__ = [
    "CODEGENS",
    "CudaPayload",
    "compile_cuda_payload",
    "cuda_runtime_available",
    "cuda_source_module",
    "load_cuda_payload",
    "module_payload",
    "nvcc_version",
    "recall_source",
]

# Environment variables TVM's CUDA compile path (tvm.support.nvcc) reads.
COMPILE_ENV = (
    "TVM_CUDA_PTXAS_REG_LEVEL",
    "TVM_CUDA_PTXAS_EXTRA_OPTS",
    "TVM_CUDA_NVCC_NO_FAST_MATH",
    "TVM_KERNEL_DEBUG",
    "TVM_KERNEL_DUMP",
)
_U64 = struct.Struct("<Q")
# TVM_COMPILE_FORCE_FALLBACK is process-wide: one thread at a time may set it.
_fallback_lock = threading.Lock()
# Compiled modules loaded from bytes do not keep their CUDA source; remember it for the cache.
_SOURCES_MAX = 256
_sources: OrderedDict[bytes, str] = OrderedDict()
_sources_lock = threading.Lock()


def cuda_runtime_available() -> bool:
    """True when TVM's CUDA runtime (and so a CUDA driver library) is loaded in this process."""
    return tvm.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is not None


@dataclass(frozen=True, slots=True)
class CudaPayload:
    """TVM's CUDA module save format: [fmt][function map][code], each length-prefixed."""

    fmt: str
    fmap: bytes
    code: bytes

    def to_bytes(self) -> bytes:
        """Serialize in TVM's byte format (what `ffi.Module.load_from_bytes.cuda` reads)."""
        fmt = self.fmt.encode()
        return b"".join((_U64.pack(len(fmt)), fmt, self.fmap, _U64.pack(len(self.code)), self.code))

    @classmethod
    def from_bytes(cls, data: bytes) -> CudaPayload:
        """Parse TVM's byte format; raise ArtifactError on anything malformed."""
        try:
            fmt, pos = _read_str(data, 0)
            fmap_start = pos
            pos = _skip_fmap(data, pos)
            fmap_end = pos
            code, pos = _read_str(data, pos)
        except (struct.error, UnicodeDecodeError, ValueError) as err:
            raise ArtifactError(f"CUDA payload is malformed ({err})", kind="cuda") from None
        if pos != len(data):
            raise ArtifactError(f"CUDA payload has {len(data) - pos} trailing bytes", kind="cuda")
        return cls(fmt.decode("ascii"), data[fmap_start:fmap_end], code)


def _read_str(data: bytes, pos: int) -> tuple[bytes, int]:
    (length,) = _U64.unpack_from(data, pos)
    end = pos + 8 + length
    if end > len(data):
        raise ValueError(f"a field of {length} bytes runs past the end ({len(data)} bytes)")
    return data[pos + 8 : end], end


def _skip_fmap(data: bytes, pos: int) -> int:
    # Map<String, FunctionInfo>: count, then per entry the key and FunctionInfo::Save's fields:
    # name, arg_types (4-byte DLDataType each), launch_param_tags (strings), arg_extra_tags (u32).
    (count,) = _U64.unpack_from(data, pos)
    pos += 8
    for _ in range(count):
        _key, pos = _read_str(data, pos)
        _name, pos = _read_str(data, pos)
        (n_args,) = _U64.unpack_from(data, pos)
        pos += 8 + 4 * n_args
        (n_tags,) = _U64.unpack_from(data, pos)
        pos += 8
        for _ in range(n_tags):
            _tag, pos = _read_str(data, pos)
        (n_extra,) = _U64.unpack_from(data, pos)
        pos += 8 + 4 * n_extra
        if pos > len(data):
            raise ValueError("function map runs past the end")
    return pos


def module_payload(module: Module) -> CudaPayload:
    """The save-to-bytes payload of a CUDA runtime module (no imports), parsed."""
    packed = tvm.get_global_func("runtime.ModulePackImportsToTensor")(module).numpy().tobytes()
    # Container: [u64 size][u64 n][n x u64 row_ptr][u64 m][m x u64 child][str kind][bytes payload]
    pos = 8
    (rows,) = _U64.unpack_from(packed, pos)
    pos += 8 + 8 * rows
    (children,) = _U64.unpack_from(packed, pos)
    pos += 8 + 8 * children
    (kind_len,) = _U64.unpack_from(packed, pos)
    kind = packed[pos + 8 : pos + 8 + kind_len]
    pos += 8 + kind_len
    if kind != b"cuda":
        raise ArtifactError(f"expected a cuda module, found {kind!r}", kind="cuda")
    (size,) = _U64.unpack_from(packed, pos)
    payload = packed[pos + 8 : pos + 8 + size]
    return CudaPayload.from_bytes(payload)


def cuda_source_module(mod: IRModule, target: Target) -> Module:
    """CUDA source as TVM's source-only (fallback) module, never compiled."""
    build = tvm.get_global_func("target.build.cuda")
    if not cuda_runtime_available():
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


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    """`nvcc --version`'s last line (the build id), or 'none' where nvcc is not found.

    The path is left out, so hosts with the same nvcc share keys wherever it is installed.
    """
    nvcc = find_nvcc()
    if nvcc is None:
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


def remember_source(code: bytes, source: str) -> None:
    """Keep the CUDA source of a compiled binary, which TVM's loaded module does not hold."""
    with _sources_lock:
        _sources[code] = source
        _sources.move_to_end(code)
        while len(_sources) > _SOURCES_MAX:
            _sources.popitem(last=False)


def recall_source(code: bytes) -> str | None:
    """The CUDA source remembered for a compiled binary, if any."""
    with _sources_lock:
        return _sources.get(code)


def load_cuda_payload(payload: CudaPayload) -> Module:
    """Load a compiled payload through TVM's CUDA runtime; a clear error where it is missing."""
    loader = tvm.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True)
    if loader is None:
        raise CudaRuntimeUnavailableError("load a compiled CUDA module")
    return loader(payload.to_bytes())


def build_cuda(mod: IRModule, target: Target) -> Module:
    """Compiled CUDA module: nvcc for the target's arch, loaded through TVM's CUDA runtime."""
    if not cuda_runtime_available():
        raise CudaRuntimeUnavailableError("build a compiled CUDA module")
    payload, _source = compile_cuda_payload(mod, target)
    return load_cuda_payload(payload)


def _cuda_toolchain(target: Target, compile_device: bool) -> dict[str, str]:
    # Looked up on every key (a few microseconds): a hook registered a moment ago changes the
    # source, so a cached answer here could serve a stale entry.
    hook = tvm.get_global_func("tvm_callback_cuda_postproc", allow_missing=True)
    salts = {"postproc_hook": str(hook is not None)}
    if compile_device:
        salts["nvcc"] = nvcc_version()
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
