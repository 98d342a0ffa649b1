"""tilelang.compile through the cache at the frontend: a function compiled before comes back unlowered.

While enabled, the `cached` that tilelang.compile calls is replaced. Its key (a CacheKey of
named parts) is what tilelang.compile is given and what its output depends on:

- `func`: the PrimFunc's structural hash (map_free_vars; its attrs — out_idx, pass configs,
  compile flags set on the function — are part of it);
- `call`: target and target_host as given (canonical JSON), execution backend, out_idx, pass
  configs, compile flags and verbose (nvcc's flags depend on it), env defaults filled in;
- salts: TVM, tvm-ffi, LLVM (the `tvm` salt names tilelang's TVM build), tilelang's version,
  the TILELANG_*/TL_*/CUDA variables (_salts.env_part), the tilelang_callback_* functions of the
  target's kind, the headers digest and nvcc, the machine, the entry format.

Not keyable, so handed to tilelang unchanged: target "auto" or a GPU target without an arch
(they depend on the GPU present),
extra positional arguments, tilelang < 0.1.14 (its KernelCache keeps kernel parameters as
pickles; this cache never unpickles; the device level still serves those versions).

An entry is one file, `<cache dir>/tilelang/<digest>.so`: the frame (payload first) whose
field 0 is the kernel library; a hit gives tilelang a private copy of those checked bytes to
load (never the entry's file, which another process may change meanwhile); fields 1 and 2 are
the device and host sources; kernel parameters are tilelang's JSON (dump_kernel_params), and
where every dimension is a number also plain JSON (`static_params`: dtype and shape, read
without TVM's JSON loader, a cost of a fresh process's hit: docs/tilelang.md). A hit
checks the frame's checksum, then rebuilds the kernel with the execution backend's own
`_build_kernel` (JITKernel.from_database), as tilelang's KernelCache does: no lowering, no
codegen, no compile. A hit in memory is the same JITKernel object, after an exact comparison
(same object or structural_equal); with `verify=True` a disk hit also compares the function's
JSON digest.

While a miss compiles, tilelang's own KernelCache is switched off: with our cache enabled it
would only store a second copy (docs/tilelang.md).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

import xxhash

from .. import _compat
from .._artifacts import Artifact, frame, unframe
from .._artifacts._private import private_file
from .._cache import CodegenCache
from .._storage._layout import FRONTEND_DIR
from .._context import active_cache
from .._errors import ArtifactError, CacheLinkError
from .._forksafe import renew_after_fork
from .._key import CacheKey, static_salts
from .._log import warn_once
from .._outcome import emit
from .._storage._faults import ensure_dir, freeze_file_mode
from .._storage._plain import PlainFiles
from .._targets import canonical_target
from . import _salts
from ._entry import ENTRY_CODEC, entry_problem

__all__ = ["ENTRY_CODEC", "FRONTEND_FORMAT", "entry_problem", "install", "uninstall"]

logger = logging.getLogger(__name__)

FRONTEND_FORMAT = "1"
_MAX_ENTRY = 512 << 20
_MEMORY_MAX = 256
_saved: dict[str, Any] = {}
_memory: dict[str, tuple[Any, Any]] = {}  # digest -> (func, JITKernel)
_lock = threading.Lock()
_off_lock = threading.Lock()
renew_after_fork(globals(), "_lock")
renew_after_fork(globals(), "_off_lock")
_off_depth = [0, True]  # nested misses; whether tilelang's cache was on before the first


# ---- the key ---------------------------------------------------------------------------------


def _canonical(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, _compat.Target):
        return {"target": canonical_target(value)}
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return _salts._jsonable(value)  # noqa: SLF001 - TVM objects: as the pass-config part keys them


def _kind(target: Any) -> str | None:
    if isinstance(target, _compat.Target):
        return target.kind.name
    if isinstance(target, dict):
        return str(target.get("kind"))
    if isinstance(target, str):
        text = target.strip()
        return text.split()[0] if text and not text.startswith("{") else None
    return None


_GPU_KINDS = frozenset({"cuda", "hip", "rocm"})


def _names_arch(target: Any) -> bool:
    if isinstance(target, _compat.Target):
        return bool(target.attrs.get("arch"))
    if isinstance(target, dict):
        return bool(target.get("arch"))
    return isinstance(target, str) and ("-arch=" in target or "-mcpu=" in target)


def frontend_key(cache: CodegenCache, func: Any, call: dict[str, Any]) -> CacheKey | None:
    """The key of one tilelang.compile call, or None where it cannot be keyed (module docstring)."""
    from tilelang import env as tl_env

    target = call["target"] if call["target"] is not None else tl_env.get_default_target()
    if isinstance(target, str) and target.strip() == "auto":
        return None
    kind = _kind(target)
    if kind is None or (kind in _GPU_KINDS and not _names_arch(target)):
        return None  # tilelang may fill the arch in from the GPU present: not a function of the call
    filled = {**call, "target": target,
              "execution_backend": call["execution_backend"] or tl_env.get_default_execution_backend(),
              "verbose": bool(call["verbose"]) if call["verbose"] is not None else bool(tl_env.get_default_verbose())}
    text = json.dumps(_canonical(filled), sort_keys=True, separators=(",", ":"))
    parts = [
        ("func", f"{_compat.structural_hash(func) & 0xFFFFFFFFFFFFFFFF:016x}"),
        ("call", text),
        *static_salts(),
        ("tilelang", _salts.tilelang_version()),
        ("env", _salts.env_part()),
        ("callbacks", json.dumps(_salts.callback_part(kind), sort_keys=True)),
        *sorted(_salts.compile_salts(cache.directory).items()),
        ("machine", platform.machine()),
        ("frontend_format", FRONTEND_FORMAT),
    ]
    return CacheKey.from_parts(parts)


# ---- entries: one file per kernel ------------------------------------------------------------


def _entry_path(cache: CodegenCache, digest: str) -> Path:
    return Path(cache.directory) / FRONTEND_DIR / f"{digest}.so"


def _names(func: Any) -> list[str]:
    """The kernel's name (its global_symbol) for `codegen-cache ls`, if it has one."""
    try:
        name = func.attrs["global_symbol"] if func.attrs is not None and "global_symbol" in func.attrs else None
    except (AttributeError, TypeError, KeyError):
        return []
    return [str(name)] if name is not None else []


def _func_digest(func: Any) -> str:
    return xxhash.xxh3_128_hexdigest(_compat.save_json(func).encode())


def _read_entry(path: Path, key: CacheKey):
    """The entry's artifact, or None (missing, another key's, or corrupt: then removed)."""
    store = PlainFiles(path.parent, max_bytes=_MAX_ENTRY)
    try:
        blob = store.get(key.digest)
        if blob is None:
            return None
        art = unframe(blob)
        problem = entry_problem(art, key.digest)
        if problem is not None:
            raise ArtifactError(problem, kind=ENTRY_CODEC)
        return art
    except (OSError, ArtifactError) as err:
        warn_once(logger, ("tilelang-entry", str(path.parent)), "codegen cache: dropping a bad tilelang entry "
                  "%s: %s", path.name, err)
        store.delete(key.digest)
        return None


def _write_entry(path: Path, blob: bytes) -> None:
    tmp = path.with_name(f"cgc-{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # swept if left
    try:
        ensure_dir(path.parent, path.parent.parent)  # <cache>/tilelang: never through a link
        with open(tmp, "xb") as handle:
            handle.write(blob)
            freeze_file_mode(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if not isinstance(err, CacheLinkError):  # that one was warned about where it was found
            warn_once(logger, ("tilelang-write", str(path.parent)), "codegen cache: cannot store tilelang kernels "
                      "in %s (%s); compiles still work", path.parent, err)
        with contextlib.suppress(OSError):
            tmp.unlink()


# ---- tilelang's own pieces, per version --------------------------------------------------------


def _takes_target_host(resolve: Any) -> bool:
    """Whether tilelang's _resolve_cache_dispatch takes target_host (0.1.14+).

    Read from its code object's argument names where it has one, cheaper for enable() than
    inspect.signature.
    """
    code = getattr(resolve, "__code__", None)
    if code is not None:
        return "target_host" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return "target_host" in inspect.signature(resolve).parameters


def _dispatch(original_module: Any, call: dict[str, Any]):
    """(tilelang's KernelCache for the backend, keyword arguments its _build_kernel takes besides the entry)."""
    resolve = original_module._resolve_cache_dispatch  # noqa: SLF001
    if _takes_target_host(resolve):  # 0.1.14+
        kernel_cache, context, _verbose = resolve(call["target"], call["target_host"], call["execution_backend"],
                                                  call["verbose"])
        return kernel_cache, {"backend_context": context}
    raise NotImplementedError("tilelang < 0.1.14")


def _stored_dispatch(original_module: Any, call: dict[str, Any], stored: Any):
    """What _dispatch gives, rebuilt from the entry's resolved context (no target resolution); None: resolve."""
    if not isinstance(stored, dict):
        return None
    try:
        from tilelang import env as tl_env
        from tilelang.backend.module import BackendContext, get_backend

        module = get_backend(stored["backend"])
        target = _compat.target_from_json(stored["target"])
        host = _compat.target_from_json(stored["target_host"])
        requested = call["execution_backend"] or tl_env.get_default_execution_backend()
        # What "auto" picks depends on what is installed now: it must still pick the stored one.
        spec = module.resolve_execution_backend(requested, target)
        if spec.name != stored["execution_backend"]:
            return None
        context = BackendContext(module=module, target=target, target_host=host, execution_backend=spec)
        dispatch = original_module._ascend_dispatch_map if module.name == "ascend" else original_module._dispatch_map  # noqa: SLF001
        return dispatch[spec.name], {"backend_context": context}
    except (KeyError, ValueError, TypeError, AttributeError, RuntimeError) as err:
        logger.debug("tilelang entry context not reusable (%s); resolving the target", err)
        return None


def _store(cache: CodegenCache, key: CacheKey, func: Any, kernel: Any, call: dict[str, Any], original_module: Any,
           codegen_seconds: float) -> bool:
    """Store a compiled kernel as the backend's own KernelCache would save it (its export code), in one entry."""
    import shutil
    import tempfile

    from tilelang.engine.param import dump_kernel_params

    kernel_cache, extra = _dispatch(original_module, call)
    context = extra["backend_context"]
    root = Path(cache.directory) / FRONTEND_DIR
    try:
        ensure_dir(root, cache.directory)
        staging = tempfile.mkdtemp(prefix="cgc-tl-", dir=root)
    except OSError as err:
        if not isinstance(err, CacheLinkError):
            warn_once(logger, ("tilelang-write", str(root)), "codegen cache: cannot store tilelang kernels in %s "
                      "(%s); compiles still work", root, err)
        return False
    try:
        # tilelang's own writers (per execution backend): the sources and the library it loads.
        kernel_cache._save_kernel_source_code_to_disk(kernel, staging)  # noqa: SLF001
        kernel_cache._save_wrapper_kernel_code_to_disk(kernel, staging)  # noqa: SLF001
        kernel_cache._save_so_cubin_to_disk(kernel, staging)  # noqa: SLF001
        staged = Path(staging)
        library = (staged / kernel_cache.kernel_lib_path).read_bytes()
        device = (staged / kernel_cache.device_kernel_path).read_bytes()
        host = (staged / kernel_cache.host_kernel_path).read_bytes()
    except (OSError, RuntimeError, ValueError, AttributeError) as err:
        logger.debug("tilelang kernel not stored: %s", err)
        return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    meta = {"key": key.digest, "parts": key.as_dict(), "params": dump_kernel_params(kernel.params),
            "static_params": _static_params(kernel.params),
            "build_seconds": codegen_seconds, "created": time.time(), "func_names": _names(func),
            # The resolved backend context, so that a hit skips tilelang's target resolution.
            "context": {"backend": context.module.name, "target": canonical_target(context.target),
                        "target_host": canonical_target(context.target_host),
                        "execution_backend": context.execution_backend.name}}
    if cache.settings.verify:
        meta["ir_digest"] = _func_digest(func)
    _write_entry(_entry_path(cache, key.digest), frame(ENTRY_CODEC, meta, [library, device, host]))
    # Bounded like compiled/ (the same limit, for this store on its own): oldest entries go first.
    PlainFiles(root).cull(cache.settings.compiled_size_limit, keep=key.digest)
    return True


def _static_params(params: Any) -> list | None:
    """[[dtype, [dims]], ...] where every dimension is an int (None: a symbolic one; tilelang's JSON holds it)."""
    static = []
    for param in params:
        shape = list(param.shape)
        if not all(type(dim) is int for dim in shape):
            return None
        static.append([str(param.dtype), shape])
    return static


def _kernel_params(meta: dict) -> list:
    """The entry's kernel parameters, as tilelang's load_kernel_params gives them."""
    static = meta.get("static_params")
    if isinstance(static, list) and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                        and isinstance(p[1], list) and all(type(d) is int for d in p[1])
                                        for p in static):
        from tilelang.engine.param import KernelParam

        return [KernelParam(_compat.tvm.DataType(dtype), list(shape)) for dtype, shape in static]
    from tilelang.engine.param import load_kernel_params

    return load_kernel_params(meta["params"])


def _load(cache: CodegenCache, key: CacheKey, func: Any, call: dict[str, Any], original_module: Any):
    from tilelang.jit.adapter.base import CachedTextSource

    path = _entry_path(cache, key.digest)
    art = _read_entry(path, key)
    if art is None:
        return None
    if cache.settings.verify and art.meta.get("ir_digest") != _func_digest(func):
        return None  # another function with the same 64-bit hash: compile it
    kernel_cache, extra = _stored_dispatch(original_module, call, art.meta.get("context")) or \
        _dispatch(original_module, call)
    from tilelang.transform.pass_config import normalize_pass_configs

    try:
        # The library tilelang loads is a private copy of the bytes just checked, never the
        # entry's file: that may be replaced, rewritten or truncated by then (_private.py).
        library = private_file(art.fields[0], cache.scratch_dir(), f"{key.digest}.so")
        return kernel_cache._build_kernel(  # noqa: SLF001 - what tilelang's KernelCache calls on its own hits
            func=func,
            host_kernel_source=CachedTextSource(text=bytes(art.fields[2]).decode()),
            device_kernel_source=CachedTextSource(text=bytes(art.fields[1]).decode()),
            kernel_lib_path=library,
            kernel_params=_kernel_params(art.meta),
            out_idx=call["out_idx"],
            pass_configs=normalize_pass_configs(call["pass_configs"]),
            compile_flags=call["compile_flags"],
            **extra,
        ), art.meta.get("build_seconds", 0.0)
    except (RuntimeError, ValueError, TypeError, OSError, UnicodeDecodeError) as err:
        warn_once(logger, ("tilelang-load", str(path.parent)), "codegen cache: a stored tilelang kernel did not "
                  "load (%s); compiling it", err)
        with contextlib.suppress(OSError):
            path.unlink()
        return None


@contextlib.contextmanager
def _tilelang_cache_off():
    """tilelang's own KernelCache off while a miss compiles (process-wide; nested and threaded misses counted)."""
    from tilelang import env as tl_env

    with _off_lock:
        if _off_depth[0] == 0:
            _off_depth[1] = tl_env.is_cache_enabled()
            tl_env.disable_cache()
        _off_depth[0] += 1
    try:
        yield
    finally:
        with _off_lock:
            _off_depth[0] -= 1
            if _off_depth[0] == 0 and _off_depth[1]:
                tl_env.enable_cache()


# ---- the replacement for tilelang.jit.cached -------------------------------------------------


def _remember(digest: str, func: Any, kernel: Any) -> None:
    with _lock:
        if len(_memory) >= _MEMORY_MAX:
            _memory.pop(next(iter(_memory)))
        _memory[digest] = (func, kernel)


def _from_memory(digest: str, func: Any):
    found = _memory.get(digest)
    if found is None:
        return None
    kept, kernel = found
    return kernel if kept.same_as(func) or _compat.structural_equal(kept, func) else None


def _cached(original, original_module):
    def cached(func=None, out_idx=None, *args, target=None, target_host=None, execution_backend=None,
               verbose=None, pass_configs=None, compile_flags=None):
        call = {"target": target, "target_host": target_host, "execution_backend": execution_backend,
                "out_idx": out_idx, "pass_configs": pass_configs, "compile_flags": compile_flags, "verbose": verbose}

        def tilelangs_own():
            return original(func, out_idx, *args, target=target, target_host=target_host,
                            execution_backend=execution_backend, verbose=verbose, pass_configs=pass_configs,
                            compile_flags=compile_flags)

        cache = active_cache()
        if args or not isinstance(cache, CodegenCache) or not isinstance(func, _compat.PrimFunc) or not cache.trusted:
            return tilelangs_own()  # an untrusted directory (another user could change it): not used
        start = time.perf_counter()
        key = frontend_key(cache, func, call)
        if key is None:
            return tilelangs_own()
        key_seconds = time.perf_counter() - start
        kernel = _from_memory(key.digest, func)
        if kernel is not None:
            _emit("memory", key, key_seconds, start, 0.0, None)
            return kernel
        loaded = _load(cache, key, func, call, original_module)
        if loaded is not None and loaded[0] is not None:
            _remember(key.digest, func, loaded[0])
            _emit("disk", key, key_seconds, start, float(loaded[1] or 0.0), None)
            return loaded[0]
        with _tilelang_cache_off():
            t0 = time.perf_counter()
            kernel = tilelangs_own()
            seconds = time.perf_counter() - t0
        stored = _store(cache, key, func, kernel, call, original_module, seconds)
        _remember(key.digest, func, kernel)
        _emit("codegen", key, key_seconds, start, seconds, stored)
        return kernel

    cached.__doc__ = original.__doc__
    return cached


def _emit(tier: str, key: CacheKey, key_seconds: float, start: float, seconds: float, stored: bool | None) -> None:
    total = time.perf_counter() - start
    emit(tier=tier, key=key.digest, codegen="tilelang.compile", mode="kernel", key_seconds=key_seconds,
         load_seconds=total - key_seconds, codegen_seconds=seconds, total_seconds=total, stored=stored)


def install() -> bool:
    """Replace the `cached` tilelang.compile calls; False where this tilelang is not supported (< 0.1.14)."""
    if _saved:
        return True
    import importlib

    jit = importlib.import_module("tilelang.jit")
    cache_module = importlib.import_module("tilelang.cache")
    resolve = getattr(cache_module, "_resolve_cache_dispatch", None)
    if resolve is None or not _takes_target_host(resolve):
        return False
    try:
        from tilelang.engine.param import dump_kernel_params, load_kernel_params  # noqa: F401
    except ImportError:
        return False
    _saved["cached"] = jit.cached
    jit.cached = _cached(jit.cached, cache_module)
    return True


def uninstall() -> None:
    """Give tilelang.compile back tilelang's own `cached`."""
    if "cached" in _saved:
        import importlib

        importlib.import_module("tilelang.jit").cached = _saved.pop("cached")
    with _lock:
        _memory.clear()
