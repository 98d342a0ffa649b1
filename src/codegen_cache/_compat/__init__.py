"""Every TVM access the package makes, in one place, for both TVM distributions it runs on.

- apache-tvm 0.27 from PyPI (`pip install 'tvm-codegen-cache[tvm]'`);
- the TVM that tilelang bundles under `tilelang/3rdparty/tvm` (`[tilelang]`: TVM 0.25.dev,
  apache-tvm-ffi < 0.1.13). It is importable only once `import tilelang` has put it on
  sys.path and loaded its libraries, so where tilelang is installed it is imported first.
  That TVM has no `tvm._version`, and its `get_tir_pipeline` returns one pass (the finalize
  passes live in `tvm.tirx.pipeline`) where apache-tvm 0.27 returns three.

Names that moved between TVMs are resolved here once; the rest of the package reads TVM names
as attributes of this module, `_compat.Target` (tests/test_compat.py checks that no other
module imports tvm). TVM is imported on the first read of one of those names (`_tvm` holds
them), not with this module: the commands that only read a cache directory (`codegen-cache
stats`, `ls`, ...) never pay for a TVM import. After that first read each name is a plain
attribute of this module. Modules above this one therefore do not bind TVM names at import
(`from .._compat import Target` would import TVM); type annotations name them under
TYPE_CHECKING.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._tvm import *  # noqa: F403

__all__ = [
    "DISTRIBUTION",
    "DLDeviceType",
    "IRModule",
    "Module",
    "ModuleMethods",
    "PrimFunc",
    "REGISTRATION_POINTS",
    "Target",
    "Tensor",
    "bound_constants",
    "builtin_func",
    "cuda_compute_version",
    "cuda_runtime_available",
    "current_database",
    "error_class",
    "error_identity",
    "ffi_function",
    "ffi_version",
    "global_func",
    "global_func_names",
    "host_llvm_triple",
    "llvm_version_major",
    "module_property_mask",
    "named_pipelines",
    "target_kinds",
    "op_attr",
    "op_attr_values",
    "operators",
    "require_installed",
    "runtime_enabled",
    "save_json",
    "script_tirx",
    "split_host_device_mods",
    "structural_equal",
    "structural_hash",
    "structure_equal",
    "structure_hash",
    "target_from_json",
    "tensor_buffer",
    "tir_pipeline",
    "tvm",
    "tvm_ffi",
    "tvm_version",
]

_INSTALL_HINT = (
    "tvm-codegen-cache needs a TVM and none is importable here. Install one of its extras: "
    "pip install 'tvm-codegen-cache[tvm]' (apache-tvm 0.27) or "
    "pip install 'tvm-codegen-cache[tilelang]' (the TVM that tilelang bundles)."
)


def __getattr__(name: str) -> Any:
    """A TVM name: imports TVM (through `_tvm`) on the first read, then every name is a plain attribute."""
    if name.startswith("_"):  # dunders, and the submodule _tvm while it is being imported
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _tvm

    if name not in _tvm.__all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    namespace = globals()
    for loaded in _tvm.__all__:
        namespace.setdefault(loaded, getattr(_tvm, loaded))  # a name a test replaced stays replaced
    return namespace[name]


def require_installed() -> None:
    """ImportError naming both extras unless a TVM (apache-tvm or tilelang's) can be found; imports none."""
    for name in ("tilelang", "tvm"):
        try:
            if importlib.util.find_spec(name) is not None:
                return
        except (ImportError, ValueError):  # a broken or half-removed install counts as none
            continue
    raise ImportError(_INSTALL_HINT)


def module_property_mask(*, runnable: bool, exportable: bool, serializable: bool) -> int:
    """A runtime module property mask (tvm-ffi's ModulePropertyMask bits)."""
    return (1 if serializable else 0) | (2 if runnable else 0) | (4 if exportable else 0)
