"""tvm-codegen-cache: a device-codegen registry for Apache TVM under a content-addressed cache.

Importing the package imports no TVM: the registry, the cache and its stores read TVM names
through `_compat`, which imports TVM on first use, so `codegen-cache stats` and the other
commands that only read a cache directory start without it. Importing it brings in the
registry and its built-in codegens only: the cache and its stores (SQLite, diskcache), the
settings, the build driver, the switch and the CLI are imported on the first use of one of
their names, from `_LAZY` (a module attribute afterwards), and the default cache of
DeviceCodegen.lower on its first lowering. Importing this package still raises ImportError
naming both extras where no TVM is installed.
"""

import importlib as _importlib
import sys as _sys

from typing import TYPE_CHECKING as _TYPE_CHECKING

if "tvm" not in _sys.modules:
    # Keep what TVM's import leaves in its modules (a meta-path finder that changes nothing of TVM):
    # a whole compile's first key takes those modules as clean without reading them (_build/_imports.py).
    try:
        import _codegen_cache_startup as _startup
    except ImportError:  # a copy of the package without its top-level modules: nothing is kept
        pass
    else:
        _startup.watch()

from . import _compat, _context
from ._context import get_cache, use_cache
from ._errors import (
    ArtifactError,
    CachedCodegenError,
    CodegenCacheError,
    ConfigError,
    CudaRuntimeUnavailableError,
    PrepareError,
    UncacheableError,
)
from ._key import CacheKey
from ._outcome import Outcome, last_outcome, record_outcomes
from ._registry import (
    DeviceCodegen,
    DeviceCodegenFunc,
    DeviceCodegenRegistry,
    TargetPredicate,
    allowed_device_codegens_for_target,
    default_registry,
    global_func_device_codegen,
    register_device_codegen,
    register_lazy_device_codegen,
    resolve_device_codegen,
)
from ._version import __version__ as __version__
from .codegens import install_builtins as _install_builtin_codegens

if _TYPE_CHECKING:
    from ._cache import CodegenCache
    from ._cache._snapshot import CacheStats
    from ._config import Settings, settings_from_env

_compat.require_installed()
_install_builtin_codegens(default_registry)


def _default_cache() -> object:
    # The cache layer registers its own factory when it is imported; this one imports it first.
    from ._cache._cache import _default_cache as made_by_the_cache_layer

    return made_by_the_cache_layer()


_context.set_default_factory(_default_cache)

# name -> (module, attribute; None: the module itself), imported on first use.
_LAZY = {
    "BuildPart": ("._build", "BuildPart"),
    "BuildRecord": ("._build", "BuildRecord"),
    "CachedBuild": ("._build", "CachedBuild"),
    "PreparedKernel": ("._build", "PreparedKernel"),
    "build": ("._build", "build"),
    "build_key": ("._build", "build_key"),
    "build_with_record": ("._build", "build_with_record"),
    "cached_export": ("._build", "cached_export"),
    "CacheStats": ("._cache._snapshot", "CacheStats"),
    "CodegenCache": ("._cache", "CodegenCache"),
    "Settings": ("._config", "Settings"),
    "settings_from_env": ("._config", "settings_from_env"),
    "declare_salt": ("._build", "declare_salt"),
    "explain_model": ("._build._model_explain", "explain_model"),
    "metaschedule_builder": ("._build", "metaschedule_builder"),
    "prepare_for_codegen": ("._build", "prepare_for_codegen"),
    "prepare_kernel": ("._build", "prepare_kernel"),
    "main": ("._cli", "main"),
    "FsReport": ("._storage._fsprobe", "FsReport"),
    "probe_filesystem": ("._storage._fsprobe", "probe"),
    "RedisTier": ("._storage._remote", "RedisTier"),
    "disable": ("._switch", "disable"),
    "enable": ("._switch", "enable"),
    "is_enabled": ("._switch", "is_enabled"),
    "callback_salts": (".codegens._callbacks", "callback_salts"),
    "declare_callback_salt": (".codegens._callbacks", "declare_callback_salt"),
    "tilelang": (".tilelang", None),
}


__all__ = [
    "ArtifactError",
    "BuildPart",
    "BuildRecord",
    "CacheKey",
    "CacheStats",
    "CachedBuild",
    "CachedCodegenError",
    "CodegenCache",
    "CodegenCacheError",
    "ConfigError",
    "CudaRuntimeUnavailableError",
    "DeviceCodegen",
    "DeviceCodegenFunc",
    "DeviceCodegenRegistry",
    "FsReport",
    "Outcome",
    "PrepareError",
    "PreparedKernel",
    "RedisTier",
    "Settings",
    "TargetPredicate",
    "UncacheableError",
    "allowed_device_codegens_for_target",
    "build",
    "build_key",
    "build_with_record",
    "cached_export",
    "callback_salts",
    "declare_callback_salt",
    "declare_salt",
    "default_registry",
    "disable",
    "enable",
    "explain_model",
    "get_cache",
    "global_func_device_codegen",
    "is_enabled",
    "last_outcome",
    "main",
    "metaschedule_builder",
    "prepare_for_codegen",
    "prepare_kernel",
    "probe_filesystem",
    "record_outcomes",
    "register_device_codegen",
    "register_lazy_device_codegen",
    "resolve_device_codegen",
    "settings_from_env",
    "use_cache",
]


def __getattr__(name: str) -> object:
    """A name of `_LAZY`, imported now and kept as a module attribute."""
    lazy = _LAZY.get(name)
    if lazy is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _importlib.import_module(lazy[0], __name__)
    value = module if lazy[1] is None else getattr(module, lazy[1])
    globals()[name] = value
    return value
