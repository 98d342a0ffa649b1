"""tilelang's device codegen through the active cache, for tilelang 0.1.13 and 0.1.15.

- 0.1.12-0.1.13: `tilelang.engine.lower` calls `resolve_device_codegen(target).lower(...)`
  (the registry API); the name it imported is replaced by one that returns the same codegen
  wrapped.
- 0.1.14-0.1.15: `BackendModule.codegen_device(mod, target, compile_device=...)` looks the
  codegen up with `get_device_codegen(target)`; the method is replaced on the class.

Either way the codegen tilelang would call is wrapped in a codegen_cache DeviceCodegen (same
build functions) whose toolchain adds tilelang's key parts (_salts), and lowered with
`DeviceCodegen.lower`: through the active cache, or straight to tilelang's codegen where
caching is off.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from .._context import active_cache
from .._forksafe import renew_after_fork
from .._registry import DeviceCodegen
from . import _salts

__all__ = ["cached_codegen", "install", "uninstall"]

_wrapped: dict[int, tuple[Any, DeviceCodegen]] = {}
_lock = threading.Lock()
renew_after_fork(globals(), "_lock")
_saved: dict[str, Any] = {}


def _toolchain(kind: str):
    def toolchain(target, compile_device: bool) -> dict[str, str]:
        cache = active_cache()
        directory = getattr(cache, "directory", None)
        parts = {"tilelang": _salts.tilelang_version(), "pass_configs": _salts.pass_config_part(),
                 "env": _salts.env_part(), **_salts.callback_part(kind)}
        if compile_device:
            parts.update(_salts.compile_salts(directory))
        return parts

    return toolchain


def cached_codegen(codegen: Any, kind: str) -> DeviceCodegen:
    """tilelang's codegen entry wrapped: same build functions, tilelang's key parts."""
    found = _wrapped.get(id(codegen))
    if found is not None and found[0] is codegen:
        return found[1]
    ours = DeviceCodegen(f"tilelang.{codegen.name}", build=codegen.build,
                         build_without_compile=codegen.build_without_compile, toolchain=_toolchain(kind))
    with _lock:
        if len(_wrapped) >= 256:
            _wrapped.clear()
        _wrapped[id(codegen)] = (codegen, ours)  # held: the id is not reused while memoized
    return ours


class _Wrapped:
    """What 0.1.13's resolve_device_codegen returns while enabled: tilelang's entry, lowered through the cache."""

    __slots__ = ("_codegen",)

    def __init__(self, codegen: Any) -> None:
        self._codegen = codegen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._codegen, name)

    def lower(self, mod, target, *, compile_device: bool):
        """tilelang's DeviceCodegen.lower, through the active cache."""
        return cached_codegen(self._codegen, target.kind.name).lower(mod, target, compile_device=bool(compile_device))


def install() -> None:
    """Route tilelang's device codegen through the cache (idempotent)."""
    if _saved:
        return
    module_api = _backend_module_api()
    if module_api is not None:  # 0.1.14+
        original = module_api.codegen_device

        def codegen_device(self, mod, target, *, compile_device):
            codegen = self.get_device_codegen(target)
            return cached_codegen(codegen, target.kind.name).lower(mod, target, compile_device=bool(compile_device))

        codegen_device.__doc__ = original.__doc__
        _saved["codegen_device"] = original
        module_api.codegen_device = codegen_device
        return
    tl_lower = _engine_lower()
    original = tl_lower.resolve_device_codegen  # 0.1.12-0.1.13: the registry API

    def resolve_device_codegen(target):
        return _Wrapped(original(target))

    _saved["resolve_device_codegen"] = original
    tl_lower.resolve_device_codegen = resolve_device_codegen


def prepare() -> None:
    """Per-process work done once at enable(), as tilelang does its own at import: opens the
    active cache's directory (its cost: docs/tilelang.md). The tilelang_callback_* functions of
    a kind are identified at its first key, not here: a CUDA user does not pay for HIP's.
    """
    active_cache()


def uninstall() -> None:
    """Give tilelang back its own device codegen path."""
    if "codegen_device" in _saved:
        _backend_module_api().codegen_device = _saved.pop("codegen_device")
    if "resolve_device_codegen" in _saved:
        _engine_lower().resolve_device_codegen = _saved.pop("resolve_device_codegen")


def _engine_lower():
    # The module itself: tilelang.engine re-exports the function `lower` under the same name.
    return importlib.import_module("tilelang.engine.lower")


def _backend_module_api():
    try:
        from tilelang.backend.module import BackendModule
    except ImportError:
        return None
    return BackendModule if hasattr(BackendModule, "codegen_device") else None
