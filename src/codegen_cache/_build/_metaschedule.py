"""A MetaSchedule builder hook: LocalBuilder(f_build=..., f_export=...) through codegen_cache.build.

    from tvm.s_tir import meta_schedule as ms
    builder = ms.builder.LocalBuilder(f_build=CachedBuild("/path/to/cache"), f_export=cached_export)
    # or: builder = metaschedule_builder("/path/to/cache")
    ms.tune_tir(mod, target, work_dir, max_trials_global=64, builder=builder)

LocalBuilder runs f_build and f_export in worker processes that it SIGKILLs after each batch:
no atexit handler runs there, so each build writes its entries and its counters before it
returns. Workers find the cache by the directory baked into CachedBuild (pickled with it), or
else by CODEGEN_CACHE_DIR, which they inherit.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tvm.ir import IRModule
from tvm.runtime import Module
from tvm.target import Target

from .._artifacts._codecs import unframe
from ._build import BuildRecord, _codegen, _plan, build_with_record, lower_plan
from .._cache._cache import CodegenCache
from .._context import get_cache, use_cache
from .._errors import ArtifactError
from .._registry import default_registry
from .._storage._disk import STORAGE_ERRORS

__all__ = ["CachedBuild", "cached_export", "metaschedule_builder"]

# Worker-local: CachedBuild hands the record of the module it returns to cached_export, which
# LocalBuilder calls next in the same process with that module.
_EXPORTS_MAX = 16
_exports: dict[int, tuple[Module, CodegenCache | None, BuildRecord]] = {}
_caches: dict[tuple[int, str, str], CodegenCache] = {}
_caches_lock = threading.Lock()


class CachedBuild:
    """MetaSchedule's default_build, with codegen_cache.build; picklable, for worker processes."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, *,
                 cache_options: Mapping[str, Any] | None = None) -> None:
        self.cache_dir = None if cache_dir is None else str(Path(cache_dir).expanduser())
        self.cache_options = dict(cache_options or {})

    def __repr__(self) -> str:
        return f"CachedBuild({self.cache_dir!r})"

    def cache(self) -> CodegenCache | None:
        """This process's cache of `cache_dir` (default: the default cache, None when disabled)."""
        if self.cache_dir is None:
            return get_cache()
        key = (os.getpid(), self.cache_dir, repr(sorted(self.cache_options.items())))
        with _caches_lock:
            cache = _caches.get(key)
            if cache is None:
                options = {"write_behind": False, **self.cache_options}
                cache = _caches[key] = CodegenCache(self.cache_dir, **options)
            return cache

    def __call__(self, mod: IRModule, target: Target, params: Mapping[str, Any] | None = None) -> Module:
        """Build `mod` for `target` as default_build does (params are ignored there too)."""
        # default_build also imports tvm.s_tir.tensor_intrin, which parses every tensor intrinsic
        # (over a minute of CPU here) in each fresh worker. Only tensorize, while scheduling,
        # reads them; the module built here is already scheduled, so that import is left out.
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        cache = self.cache()
        try:
            with use_cache(cache):
                module, record = build_with_record(mod, target)
            if record.devices and not module.is_compilation_exportable():
                module = _exportable_host(cache, mod, target, module)
        finally:
            if cache is not None:
                cache.flush()  # entries and counters now: this worker is killed, not exited
        if len(_exports) >= _EXPORTS_MAX:
            _exports.clear()
        _exports[id(module)] = (module, cache, record)
        return module


def _exportable_host(cache: CodegenCache | None, mod: IRModule, target: Target, module: Module) -> Module:
    """A host module export_library can write (an object file): regenerated, device code kept.

    A cached host module is a loaded shared library, which export_library cannot write out and
    to which packed device imports cannot be added. So on GPU targets the host (llvm, a few ms)
    is generated again here, uncached; the device modules (the nvcc compile) come from the cache.
    """
    plan = _plan(mod, target, "default")
    host_all, _devices = lower_plan(plan)
    registry = cache.registry if cache is not None else default_registry
    fresh, _part, _entry = _codegen(None, registry, host_all, plan.host, "host")
    for device_module in module.imports:
        if not device_module.is_binary_serializable():
            # A cached CUDA *source* entry (no CUDA driver here) comes back as a plain source
            # module, which export_library cannot pack; tuning needs the GPU's runtime anyway.
            raise ValueError(
                f"cannot export a {device_module.kind!r} device module for {target.kind.name!r}: "
                "TVM's runtime for that target is not loaded here, so the cached device code is "
                "source only; run MetaSchedule where the device runtime (e.g. a CUDA driver) loads"
            )
        fresh.import_module(device_module)
    return fresh


def cached_export(module: Module) -> str:
    """MetaSchedule's default_export, which also writes a cached llvm module's shared library."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_export

    found = _exports.pop(id(module), None)
    # A loaded shared library ("library") says it is binary serializable, but cannot be written.
    if module.is_compilation_exportable():
        return default_export(module)
    if found is None or found[0] is not module or found[1] is None or module.imports:
        raise ValueError(
            f"cached_export cannot write a {module.kind!r} module that CachedBuild did not just return "
            "in this process (a module loaded from a shared library has no object file to export)"
        )
    _module, cache, record = found
    host = record.host
    try:
        blob = cache.store(host.mode).get(host.digest)
        art = unframe(blob) if blob is not None else None
    except (*STORAGE_ERRORS, ArtifactError) as err:
        raise ValueError(f"cached_export: cannot read entry {host.digest} back ({err})") from err
    if art is None or art.codec != "llvm-so":
        raise ValueError(f"cached_export: entry {host.digest} is not a stored shared library "
                         f"({'missing' if art is None else art.codec})")
    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    with open(path, "wb") as f:
        f.write(art.fields[0])
    return path


def metaschedule_builder(cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any):
    """A LocalBuilder whose workers build through the cache in `cache_dir` (kwargs go to LocalBuilder)."""
    from tvm.s_tir.meta_schedule.builder import LocalBuilder

    return LocalBuilder(f_build=CachedBuild(cache_dir), f_export=cached_export, **kwargs)
