"""tvm-codegen-cache: a device-codegen registry for Apache TVM under a content-addressed cache."""

from ._build._build import build
from ._cache._cache import CodegenCache
from ._config import Settings, settings_from_env
from ._context import get_cache, use_cache
from ._errors import (
    ArtifactError,
    CachedCodegenError,
    CodegenCacheError,
    ConfigError,
    CudaRuntimeUnavailableError,
    LoweringError,
)
from ._key import CacheKey
from ._build._lowering import LoweredKernel, lower_for_codegen, lower_kernel
from ._build._metaschedule import CachedBuild, cached_export, metaschedule_builder
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
from ._cache._stats import CacheStats
from .codegens import install_builtins as _install_builtin_codegens

_install_builtin_codegens(default_registry)

__version__ = "0.1.0"

__all__ = [
    "ArtifactError",
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
    "LoweredKernel",
    "LoweringError",
    "Outcome",
    "Settings",
    "TargetPredicate",
    "allowed_device_codegens_for_target",
    "build",
    "cached_export",
    "default_registry",
    "get_cache",
    "global_func_device_codegen",
    "last_outcome",
    "lower_for_codegen",
    "lower_kernel",
    "metaschedule_builder",
    "record_outcomes",
    "register_device_codegen",
    "register_lazy_device_codegen",
    "resolve_device_codegen",
    "settings_from_env",
    "use_cache",
]
