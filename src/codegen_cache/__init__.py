"""tvm-codegen-cache: a device-codegen registry for Apache TVM under a content-addressed cache."""

from ._build import (
    BuildPart,
    BuildRecord,
    CachedBuild,
    PreparedKernel,
    build,
    build_key,
    build_with_record,
    cached_export,
    declare_salt,
    metaschedule_builder,
    prepare_for_codegen,
    prepare_kernel,
)
from ._cache import CacheStats, CodegenCache
from ._cli import main
from ._config import Settings, settings_from_env
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
from ._storage._fsprobe import FsReport
from ._storage._fsprobe import probe as probe_filesystem
from ._storage._remote import RedisTier
from ._switch import disable, enable, is_enabled
from ._version import __version__ as __version__
from .codegens import install_builtins as _install_builtin_codegens
from .codegens._callbacks import callback_salts, declare_callback_salt

_install_builtin_codegens(default_registry)


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
