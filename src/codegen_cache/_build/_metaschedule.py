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

from .._compat import IRModule, Module, Target

from .._artifacts import CachedLibraryModule
from .._cache import CodegenCache
from .._context import get_cache, use_cache
from .._forksafe import renew_after_fork
from .._validate import check_path
from ._build import build_with_record

__all__ = ["CachedBuild", "cached_export", "metaschedule_builder"]

_caches: dict[tuple[int, str, str], CodegenCache] = {}
_caches_lock = threading.Lock()
renew_after_fork(globals(), "_caches_lock")


class CachedBuild:
    """MetaSchedule's default_build, with codegen_cache.build; picklable, for worker processes."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, *,
                 cache_options: Mapping[str, Any] | None = None) -> None:
        cache_dir = check_path("cache_dir", cache_dir, optional=True)
        if cache_options is not None and not isinstance(cache_options, Mapping):
            raise TypeError(f"cache_options must be a mapping of CodegenCache options or None, got "
                            f"{type(cache_options).__name__}")
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
                module, _record = build_with_record(mod, target)
        finally:
            if cache is not None:
                cache.flush()  # background stores now: this worker is killed, not exited
        for device_module in module.imports:
            if not device_module.is_binary_serializable():
                # A cached CUDA *source* entry (no CUDA driver here) comes back as a plain source
                # module, which export_library cannot pack; tuning needs the GPU's runtime anyway.
                raise ValueError(
                    f"cannot export a {device_module.kind!r} device module for {target.kind.name!r}: "
                    "TVM's runtime for that target is not loaded here, so the cached device code is "
                    "source only; run MetaSchedule where the device runtime (e.g. a CUDA driver) loads"
                )
        return module


def cached_export(module: Module) -> str:
    """MetaSchedule's default_export, for modules the cache served too.

    A module mapped from a cached shared library exports through its own export_library
    (called here in Python: TVM's default_export is reached through the FFI, which hands it a
    plain Module); alone, its stored library is the artifact, as a fresh build's export would be.
    """
    from tvm.support.tar import tar

    if not callable(getattr(module, "export_library", None)):
        raise TypeError(f"cached_export expects a tvm.runtime.Module (what a builder returned), got "
                        f"{type(module).__name__}")
    if isinstance(module, CachedLibraryModule) and not len(module.imports):
        path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    else:
        path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod." + tar.output_format)
    module.export_library(path, **({} if path.endswith(".so") else {"fcompile": tar}))
    return path


def metaschedule_builder(cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any):
    """A LocalBuilder whose workers build through the cache in `cache_dir` (kwargs go to LocalBuilder)."""
    from tvm.s_tir.meta_schedule.builder import LocalBuilder

    workers = kwargs.get("max_workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"max_workers must be a whole number of 1 or more (None: one per CPU), got {workers!r}")
    return LocalBuilder(f_build=CachedBuild(cache_dir), f_export=cached_export, **kwargs)
