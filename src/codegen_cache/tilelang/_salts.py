"""What tilelang's codegens and compile callbacks read besides the IR, as key parts.

- `tilelang`: tilelang's version (its TVM is in the `tvm` salt);
- `pass_configs`: every entry of the PassContext in force (tl.enable_fast_math,
  tl.ptxas_register_usage_level, tl.device_compile_flags and every other tl.* or tirx.* key:
  tilelang's CUDA compile callback and its C++ codegens read them from there);
- `env`: every TILELANG_* and TL_* variable but those in EXCLUDED_ENV, and the CUDA/nvcc ones;
- `callback:<name>`: what is registered under each tilelang_callback_* name the codegen calls;
- compiled only: `headers`, a digest of the CUDA headers the compile includes (tilelang's own
  templates, CUTLASS/CuTe), and `nvcc`, the compiler's path and `--version`.

The headers digest hashes file contents once per installation: it is kept in the cache
directory under a stamp of the two include directories and tilelang's package (their inodes and
modification times, which a reinstall changes). An edit to a header *inside* an installed
tilelang that leaves those untouched is not seen (docs/tilelang.md, limits); include
directories outside the package (TL_TEMPLATE_PATH, TL_CUTLASS_PATH) are hashed in every process.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import xxhash

from .._compat import tvm
from .. import _compat
from .._storage._faults import READ_FLAGS, read_whole
from ..codegens._callbacks import callback_salts, declare_salt_of
from ..codegens._owner import owner_name
from ..codegens.cuda import nvcc_version_at

__all__ = ["EXCLUDED_ENV", "compile_salts", "env_part", "headers_digest", "pass_config_part", "tilelang_version"]

_ENV_PREFIXES = ("TILELANG_", "TL_")
_CUDA_ENV = ("CUDA_HOME", "CUDA_PATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")
# TILELANG_*/TL_* variables that change no generated code or binary, and why.
EXCLUDED_ENV: dict[str, str] = {
    "TILELANG_CACHE_DIR": "where tilelang's own KernelCache lives",
    "TILELANG_TMP_DIR": "where temporary files go",
    "TILELANG_DISABLE_CACHE": "tilelang's own KernelCache on or off",
    "TILELANG_KERNEL_CACHE_USE_LIB_STAMP": "tilelang's own KernelCache key",
    "TILELANG_CLEANUP_TEMP_FILES": "temporary files kept or not",
    "TILELANG_HIP_SAVE_TEMP_FILES": "temporary files kept or not",
    "TILELANG_PRINT_ON_COMPILATION": "logging",
    "TILELANG_JIT_DIAGNOSTICS": "timing logs",
    "TILELANG_COMPILE_TIMEOUT_SECONDS": "a compile that times out fails and stores nothing",
    "TILELANG_PASS_DIFF": "reports", "TILELANG_PASS_DIFF_OUTPUT": "reports",
    "TILELANG_PASS_PROFILE": "reports", "TILELANG_PASS_PROFILE_THRESHOLD_MS": "reports",
    "TL_LOWER_TRACE": "reports", "TL_LOWER_TRACE_DIR": "reports",
    "TL_TEMPLATE_PATH": "keyed by content: the headers digest", "TL_CUTLASS_PATH": "keyed by content: the headers digest",
}
_EXCLUDED_PREFIXES = ("TILELANG_AUTO_TUNING_",)  # the autotuner's own settings
_CALLBACK_KINDS = {"cuda": "cuda", "hip": "hip", "rocm": "hip", "metal": "metal"}


@functools.lru_cache(maxsize=1)
def tilelang_version() -> str:
    """tilelang's version."""
    import tilelang

    return str(tilelang.__version__)


def env_part() -> str:
    """The environment variables tilelang's compile path may read, as sorted JSON."""
    environ = os.environ  # names first: decoding every value would cost a fresh process's hit
    found = {k: environ[k] for k in list(environ)
             if (k.startswith(_ENV_PREFIXES) and k not in EXCLUDED_ENV and not k.startswith(_EXCLUDED_PREFIXES))
             or k in _CUDA_ENV}
    return json.dumps(found, sort_keys=True, separators=(",", ":"))


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) or type(value).__name__ == "Map":
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, tvm.target.Target):
        return str(value.export())
    if isinstance(value, tvm_object_types()):
        return tvm.ir.save_json(value)
    return str(value)


@functools.lru_cache(maxsize=1)
def tvm_object_types() -> tuple[type, ...]:
    from .._compat import tvm_ffi

    return (tvm_ffi.Object,)


_last_context: list[tuple[object, str]] = []


def pass_config_part() -> str:
    """Every entry of the PassContext in force, as sorted JSON (memoized per PassContext object)."""
    ctx = tvm.transform.PassContext.current()
    last = _last_context[0] if _last_context else None
    if last is not None and last[0].same_as(ctx):
        return last[1]
    text = json.dumps({str(k): _jsonable(v) for k, v in ctx.config.items()}, sort_keys=True, separators=(",", ":"))
    _last_context[:] = [(ctx, text)]
    return text


# ---- compiled only: the headers and nvcc, memoized on disk by a stamp -----------------------


def _stat_stamp(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:missing"
    return f"{os.path.abspath(path)}:{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"


def _include_dirs() -> list[str]:
    from tilelang import env as tl_env

    return [str(d) for d in (tl_env.TILELANG_TEMPLATE_PATH, tl_env.CUTLASS_INCLUDE_DIR) if d]


def _hash_tree(dirs: list[str]) -> str:
    digest = xxhash.xxh3_128()
    for root in dirs:
        digest.update(f"\0root\0{os.path.basename(os.path.normpath(root))}".encode())
        for folder, subdirs, files in os.walk(root):
            subdirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                digest.update(f"\0{os.path.relpath(path, root)}\0".encode())
                try:
                    digest.update(Path(path).read_bytes())
                except OSError:
                    digest.update(b"\0unreadable")
    return digest.hexdigest()


def _memo_path(directory: Path | None) -> Path | None:
    return None if directory is None else Path(directory) / "tilelang-stamps.json"


_memo_seen: dict[str, tuple[tuple[int, int, int], dict]] = {}  # memo file -> (its stat, what it held)


def _memo_read(path: Path | None) -> dict:
    if path is None:
        return {}
    name = os.fspath(path)
    try:
        # os.read, not a buffered file's read(n): that one allocates n bytes first.
        fd = os.open(name, READ_FLAGS)
        try:
            st = os.fstat(fd)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            seen = _memo_seen.get(name)
            if seen is not None and seen[0] == stamp:
                return seen[1]  # the headers' and nvcc's stamps are read from one parse
            blob = read_whole(fd, 1_000_000)
        finally:
            os.close(fd)
        data = json.loads(blob.decode()) if blob is not None else None
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    _memo_seen[name] = (stamp, data)
    return data


def _memo_write(path: Path | None, name: str, stamp: str, value: str) -> None:
    if path is None:
        return
    data = dict(_memo_read(path))
    section = data.get(name) if isinstance(data.get(name), dict) else {}
    section = {k: v for k, v in list(section.items())[-15:]}
    section[stamp] = value
    data[name] = section
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a new cache makes its directory on first store
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def _memoized(directory: Path | None, name: str, stamp: str | None, compute) -> str:
    path = _memo_path(directory)
    if stamp is not None:
        found = _memo_read(path).get(name, {})
        if isinstance(found, dict) and isinstance(found.get(stamp), str):
            return found[stamp]
    value = compute()
    if stamp is not None:
        _memo_write(path, name, stamp, value)
    return value


@functools.lru_cache(maxsize=8)
def headers_digest(directory: Path | None) -> str:
    """Content digest of the include directories tilelang's CUDA compile passes to nvcc."""
    import tilelang

    dirs = _include_dirs()
    package = _package_dir()
    inside = all(os.path.normpath(os.path.abspath(d)).startswith(package) for d in dirs)
    # Inside an installed package, a reinstall makes new directories (new inodes, times).
    stamp = "|".join([_stat_stamp(d) for d in dirs] + [_stat_stamp(tilelang.__file__)]) if inside else None
    return _memoized(directory, "headers", stamp, lambda: _hash_tree(dirs))


def _nvcc_path() -> str:
    return _nvcc_path_for(os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), os.environ.get("PATH"))


@functools.lru_cache(maxsize=8)
def _nvcc_path_for(cuda_home, cuda_path, path) -> str:
    # tilelang's own rule (find_cuda_path reads these three): memoized per their values.
    try:
        from tilelang.contrib import nvcc

        return nvcc.get_nvcc_compiler()
    except (ImportError, RuntimeError, OSError, ValueError):
        return "none"


@functools.lru_cache(maxsize=8)
def _nvcc(directory: Path | None, path: str) -> str:
    if path == "none" or not os.path.exists(path):
        return "none"
    return f"{path} {_memoized(directory, 'nvcc', _stat_stamp(path), lambda: nvcc_version_at(path))}"


def compile_salts(directory: Path | None) -> dict[str, str]:
    """The compiled mode's extra parts: the headers digest and the nvcc in use."""
    return {"headers": headers_digest(directory), "nvcc": _nvcc(directory, _nvcc_path())}


def callback_part(kind: str) -> dict[str, str]:
    """Identity of the tilelang_callback_* functions the codegen of `kind` calls."""
    family = _CALLBACK_KINDS.get(kind)
    if family is None:
        return {}
    names = tuple(f"tilelang_callback_{family}_{what}" for what in ("postproc", "compile", "validate"))
    for name in names:
        _declare_if_tilelangs_own(name)
    return callback_salts(*names)


_checked: dict[int, object] = {}


@functools.lru_cache(maxsize=1)
def _package_dir() -> str:
    """tilelang's package directory as its modules' files name it (no symlinks resolved: no syscalls)."""
    import tilelang

    return os.path.normpath(os.path.abspath(os.path.dirname(tilelang.__file__))) + os.sep


def _declare_if_tilelangs_own(name: str) -> None:
    """Key tilelang's own callbacks by tilelang's version and their name.

    A function defined inside the installed tilelang package is what that version ships (it
    reads tilelang's own settings, which the other key parts hold). Anything else registered
    under the name is a user's hook: uncacheable without a declared salt, as any callback.
    """
    func = _compat.global_func(name, missing_ok=True)
    if func is None:
        return
    handle = func.__chandle__()
    held = _checked.get(handle)
    # Each lookup gives a new Python object for the function: the one held (alive, so its
    # address is not another function's) is compared by handle, not by identity.
    if held is not None and held.__chandle__() == handle:
        return
    # tilelang's own code, closures included: keyed by tilelang's version.
    own = owner_name(func, _package_dir(), closures=True)
    if own is not None:
        declare_salt_of(name, f"tilelang {tilelang_version()}: {own}")
    if len(_checked) >= 64:
        _checked.clear()
    _checked[handle] = func  # held: the handle is not reused while checked
