"""One switch for every TVM compile: `codegen_cache.enable()` routes TVM's entry points through the cache.

While enabled, in this process (docs/tvm.md):

| TVM entry point                         | goes to                                              |
| --------------------------------------- | ---------------------------------------------------- |
| tvm.relax.build (tvm.compile of Relax)   | the model-level cache (_build/_relax.py): a warm compile runs no pipeline |
| tvm.tirx.build (tvm.compile of TIR, tvm.driver.build, MetaSchedule's default builder) | codegen_cache.build: its build index, then every codegen call through the cache |
| TVM's `target.build.<kind>` global functions (direct calls, TVM's own C++ callers) | the active cache's lowering with the registry's codegen |

It also puts on tvm.runtime.Module the methods through which every handle of a cached llvm
module answers as the built one (_artifacts/_module_methods.py). disable() puts every one of
these back as it was, and a router someone kept while enabled (`from tvm.tirx import build`, a
function registered over a router that calls it) calls TVM's own function from then on.

Each entry point goes to TVM's own function, unchanged, wherever the cache steps aside: no
cache is active (`use_cache(None)`, CODEGEN_CACHE_DISABLE=1), or the call cannot be keyed (a
pipeline given as a Pass object, a PassContext with instruments, a module with Relax
functions given to tvm.tirx.build). A Python process started with CODEGEN_CACHE_ENABLE=1 is
enabled from its first `import tvm` (codegen_cache_enable.pth, _codegen_cache_startup.py), and
enable() sets that variable so child processes (MetaSchedule's builder workers, pools) follow.
With tilelang's TVM, enable() is codegen_cache.tilelang.enable().
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from . import _artifacts, _compat, _context, _registry
from ._artifacts import _codecs  # noqa: F401  what every compile encodes or decodes entries with: imported
# with the switch, so that a first compile (a fresh process's warm model) does not import it
from ._artifacts import as_built_root
from ._build import build as cached_tirx_build
from ._build._index import compile_device
from ._build._imports import registries_as_imported
from ._build._reads import install_hooks, uninstall_hooks
from ._build._state import own
from ._build._relax import relax_build
from ._cache import CodegenCache
from ._compat import IRModule, PrimFunc, tvm_ffi
from ._config import refuse_file_as_directory, settings_from_env
from ._forksafe import renew_after_fork

__all__ = ["disable", "enable", "enable_from_environment", "is_enabled"]

logger = logging.getLogger(__name__)

ENABLE_VAR = "CODEGEN_CACHE_ENABLE"
DIR_VAR = "CODEGEN_CACHE_DIR"
# The Python attributes enable() replaces: (module, attribute, what replaces it).
_ATTRIBUTES = (
    ("tvm.relax", "build", "relax"),
    ("tvm.relax.vm_build", "build", "relax"),
    ("tvm.tirx", "build", "tirx"),
    ("tvm.tirx.build", "build", "tirx"),
)
# Target kinds whose target.build.<kind> is routed: those with a built-in codegen.
_ROUTED_KINDS = ("llvm", "c", "cuda", "nvptx", "opencl", "metal", "rocm", "vulkan", "webgpu")

_lock = threading.RLock()
# While enabled: the replaced attributes ((module, name) -> TVM's function), the routed global
# functions (name -> (router Function, TVM's Function)), the environment values enable() set
# (name -> the value before), whether tilelang's switch is the one on, and whether enable() runs
# from the start-up hook as `import tvm` completes (at_import).
_state: dict[str, Any] = {"on": False, "attributes": {}, "globals": {}, "environ": {}, "tilelang": False,
                          "at_import": False}

# The state itself holds in a child of fork (a forked worker is as enabled as its parent).
renew_after_fork(globals(), "_lock", threading.RLock)


def is_enabled() -> bool:
    """True between enable() and disable()."""
    return bool(_state["on"])


def enable(cache: CodegenCache | None = None, *, children: bool = True) -> None:
    """Route every TVM compile in this process through the cache (idempotent).

    `cache`: the cache to use where no use_cache block says otherwise (default: the default
    cache, CODEGEN_CACHE_DIR or the user cache directory). children=True also sets
    CODEGEN_CACHE_ENABLE=1 (and, with `cache`, CODEGEN_CACHE_DIR) in os.environ, so that
    Python processes started from this one are enabled from their first `import tvm`.
    """
    if cache is not None and not isinstance(cache, CodegenCache):
        hint = f" (for a directory: enable(CodegenCache({cache!r})))" if isinstance(cache, (str, os.PathLike)) else ""
        raise TypeError(f"enable expects a CodegenCache or None, got {type(cache).__name__}{hint}")
    if not isinstance(children, bool):
        raise TypeError(f"children must be True or False, got {children!r}")
    with _lock:
        if cache is not None:
            _context.pin_default(cache)
        if children:
            _export(ENABLE_VAR, "1")
            if cache is not None:
                _export(DIR_VAR, str(cache.directory))
        if _state["on"]:
            return
        try:
            _artifacts.install_on_module()
            if _compat.DISTRIBUTION == "tilelang":
                from . import tilelang as tilelang_switch

                tilelang_switch.enable()
                _state["tilelang"] = True
            else:
                _patch_attributes()
                _route_globals()
                # As `import tvm` completes, with nothing registered before it that the start-up hook
                # saw, the registries are TVM's own by construction: nothing to read yet.
                install_hooks(as_imported=_state["at_import"] and registries_as_imported())
        except BaseException:
            disable()  # never half enabled: what was replaced before the failure is put back
            raise
        _state["on"] = True
        logger.debug("codegen cache: enabled for every TVM compile in this process")


def disable() -> None:
    """Undo enable(): TVM compiles as it does without this package (the environment as before)."""
    with _lock:
        if _state["tilelang"]:
            from . import tilelang as tilelang_switch

            tilelang_switch.disable()
            _state["tilelang"] = False
        _state["on"] = False  # first: a router someone captured steps aside from here on
        uninstall_hooks()
        _restore_attributes()
        _unroute_globals()
        _artifacts.uninstall_from_module()
        for name, before in _state["environ"].items():
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before
        _state["environ"] = {}
        _context.pin_default(None, unpin=True)


def enable_from_environment() -> bool:
    """enable() when CODEGEN_CACHE_ENABLE says so and CODEGEN_CACHE_DISABLE does not; True when enabled.

    Run by the start-up hook once `tvm` is imported. Every CODEGEN_CACHE_* value is parsed
    first and a cache directory that is a file is refused (the ConfigError every variable
    gives; the hook turns it into one warning): a setting the default cache would refuse at
    the first compile keeps the switch off instead of failing that compile. Nothing else is
    done here that `import codegen_cache` does not do: the cache's stores open at first use.
    """
    settings = settings_from_env()
    if not settings.enable or settings.disable:
        return False
    refuse_file_as_directory(settings.directory)
    _state["at_import"] = True
    try:
        enable(children=False)  # the variable is set already: children inherit it as it is
    finally:
        _state["at_import"] = False
    return True


def _export(name: str, value: str) -> None:
    if name not in _state["environ"]:
        _state["environ"][name] = os.environ.get(name)
    os.environ[name] = value


# ---- the Python entry points --------------------------------------------------------------------


def _active() -> CodegenCache | None:
    if not _state["on"]:
        return None  # a router captured while enabled (`from tvm.relax import build`, a wrapper) after disable()
    cache = _context.active_cache()
    if isinstance(cache, CodegenCache) and not cache.settings.disable and cache.trusted:
        return cache
    return None  # TVM's own entry point (a directory another user could change stores and serves nothing)


def _relax_router(original: Callable[..., Any]) -> Callable[..., Any]:
    def build(mod, target=None, params=None, relax_pipeline="default", tir_pipeline="default",
              exec_mode="bytecode", *, system_lib=None):
        cache = _active()
        if cache is None:
            return original(mod, target, params, relax_pipeline, tir_pipeline, exec_mode, system_lib=system_lib)
        return as_built_root(relax_build(original, cache, mod, target, params, relax_pipeline, tir_pipeline,
                                         exec_mode, system_lib=system_lib))

    return _wraps(build, original)


def _tirx_router(original: Callable[..., Any]) -> Callable[..., Any]:
    def build(mod, target=None, pipeline="default"):
        if _active() is None:
            return original(mod, target, pipeline)
        if not _tir_only(mod) or not isinstance(pipeline, (str, type(None))):
            return as_built_root(original(mod, target, pipeline))  # its codegen calls still reach the cache
        return as_built_root(cached_tirx_build(mod, target, pipeline))

    return _wraps(build, original)


def _tir_only(mod: Any) -> bool:
    if isinstance(mod, PrimFunc):
        return True
    return isinstance(mod, IRModule) and all(isinstance(f, PrimFunc) for f in mod.functions.values())


def _wraps(router: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    for name in ("__name__", "__qualname__", "__doc__"):  # __module__ stays ours: tracebacks say who routed
        setattr(router, name, getattr(original, name, getattr(router, name)))
    router.__wrapped__ = original  # type: ignore[attr-defined]
    router._codegen_cache_router = True  # type: ignore[attr-defined]
    return router


_ROUTERS = {"relax": _relax_router, "tirx": _tirx_router}


def _patch_attributes() -> None:
    originals: dict[str, Callable[..., Any]] = {}
    for module_name, attribute, kind in _ATTRIBUTES:
        try:
            module = sys.modules.get(module_name) or importlib.import_module(module_name)
        except ImportError:
            continue  # a TVM without that part (built without Relax)
        current = getattr(module, attribute, None)
        if not callable(current):
            continue
        if getattr(current, "_codegen_cache_router", False):
            continue  # already ours (enable() after a fork of an enabled process)
        original = originals.setdefault(kind, current)
        _state["attributes"][(module_name, attribute)] = (module, current)
        router = _router_for(kind, original)
        own(router, current)  # a key of TVM's state counts the router as what it replaced
        setattr(module, attribute, router)


_made_routers: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}


def _router_for(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
    # One router object per kind and original, so tvm.relax.build is tvm.relax.vm_build.build.
    made = _made_routers.get(kind)
    if made is None or made[0] is not original:
        made = _made_routers[kind] = (original, _ROUTERS[kind](original))
    return made[1]


def _restore_attributes() -> None:
    for (_module_name, attribute), (module, original) in _state["attributes"].items():
        if getattr(getattr(module, attribute, None), "_codegen_cache_router", False):
            setattr(module, attribute, original)
    _state["attributes"] = {}


# ---- TVM's target.build.<kind> global functions ----------------------------------------------------


def _route_globals() -> None:
    for kind in _ROUTED_KINDS:
        name = f"target.build.{kind}"
        replaced = tvm_ffi.get_global_func(name, allow_missing=True)
        if replaced is None:
            continue
        route = _codegen_router(name, replaced)
        own(route, replaced)  # a key of TVM's state counts the router as what it replaced
        tvm_ffi.register_global_func(name, route, override=True)
        router = tvm_ffi.get_global_func(name)
        _registry.route_global(name, router, replaced)
        _state["globals"][name] = (router, replaced)


def _codegen_router(name: str, replaced: Any) -> Callable[[Any, Any], Any]:
    def route(mod, target):
        cache = _active()
        if cache is None or not isinstance(mod, IRModule) or _registry.in_codegen_call(name):
            # Reached from inside a codegen's own call of this name (a user's function registered
            # over the router calls what it found there): TVM's function, not the cache again.
            return replaced(mod, target)
        codegen = cache.registry.resolve(target)
        return cache.lower(mod, target, compile_device=compile_device(codegen, target), codegen=codegen)

    return route


def _unroute_globals() -> None:
    for name, (router, replaced) in _state["globals"].items():
        current = tvm_ffi.get_global_func(name, allow_missing=True)
        if current is not None and current.__chandle__() == router.__chandle__():
            tvm_ffi.register_global_func(name, replaced, override=True)
        # else a function registered over the router stays (the user's own codegen)
        _registry.unroute_global(name)
    _state["globals"] = {}
