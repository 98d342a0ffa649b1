"""The device codegen registry, API-compatible with tilelang.backend.device_codegen."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import tvm
import tvm_ffi
from tvm.ir import IRModule
from tvm.target import Target

from ._targets import TargetLike, as_target

if TYPE_CHECKING:
    from tvm.runtime import Module

__all__ = [
    "DeviceCodegen",
    "DeviceCodegenFunc",
    "DeviceCodegenRegistry",
    "TargetPredicate",
    "allowed_device_codegens_for_target",
    "default_registry",
    "global_func_device_codegen",
    "register_device_codegen",
    "register_lazy_device_codegen",
    "resolve_device_codegen",
]

DeviceCodegenFunc = Callable[[IRModule, Target], "Module"]
TargetPredicate = Callable[[Target], bool]
# What a codegen adds to its cache key: toolchain versions, env vars it reads, its own salt.
ToolchainFunc = Callable[[Target, bool], Mapping[str, str]]


def _build_function_names() -> list[str]:
    return sorted(n for n in tvm_ffi.registry.list_global_func_names() if n.startswith("target.build."))


def global_func_device_codegen(global_func_name: str) -> DeviceCodegenFunc:
    """Create a device codegen callback backed by a TVM global function."""

    def codegen(mod: IRModule, target: Target) -> Module:
        func = tvm.get_global_func(global_func_name, allow_missing=True)
        if func is None:
            raise ValueError(
                f"TVM global function {global_func_name!r} is not registered in this TVM build. "
                f"Registered codegen functions: {_build_function_names()}."
            )
        return func(mod, target)

    codegen.__name__ = f"global_func<{global_func_name}>"
    codegen.__qualname__ = codegen.__name__
    return codegen


@dataclass(frozen=True, slots=True)
class DeviceCodegen:
    """Device codegen entry points for one backend target variant."""

    name: str
    build: DeviceCodegenFunc | None = None
    build_without_compile: DeviceCodegenFunc | None = None
    supports_target: TargetPredicate | None = None
    # Extensions (keyword defaults keep the seed's constructor unchanged):
    toolchain: ToolchainFunc | None = None
    salt: str = ""

    def matches(self, target: Target) -> bool:
        """True when this codegen accepts `target` (always, without a predicate)."""
        return self.supports_target is None or bool(self.supports_target(target))

    def _func_for(self, target: Target, compile_device: bool) -> DeviceCodegenFunc:
        func = self.build if compile_device else self.build_without_compile
        if func is None:
            mode = "with compilation" if compile_device else "without compilation"
            raise ValueError(
                f"Device codegen {self.name!r} for target {target.kind.name!r} "
                f"does not support lowering {mode}"
            )
        return func

    def supports_mode(self, compile_device: bool) -> bool:
        """True when this codegen has a function for that mode."""
        return (self.build if compile_device else self.build_without_compile) is not None

    def invoke(self, mod: IRModule, target: TargetLike, *, compile_device: bool) -> Module:
        """Call the codegen itself, bypassing every cache."""
        target = as_target(target)
        return self._func_for(target, compile_device)(mod, target)

    def lower(self, mod: IRModule, target: TargetLike, *, compile_device: bool) -> Module:
        """Lower `mod` through the active cache (see use_cache), else call the codegen."""
        from ._context import active_cache  # the cache layer sits above the registry

        target = as_target(target)
        self._func_for(target, compile_device)  # a missing mode is an error before any lookup
        cache = active_cache()
        if cache is None:
            return self.invoke(mod, target, compile_device=compile_device)
        return cache.lower(mod, target, compile_device=compile_device, codegen=self)


class DeviceCodegenRegistry:
    """Codegens per target kind, in registration order, plus lazily imported backends."""

    def __init__(self) -> None:
        self._codegens: dict[str, list[DeviceCodegen]] = {}
        self._lazy: dict[str, list[str]] = {}
        # Bumped on every change, so callers may memoize resolve() per target.
        self.version = 0
        # RLock: a lazily imported backend registers into this registry while we hold the lock.
        self._lock = threading.RLock()

    def register(self, target_kind: str, codegen: DeviceCodegen, *, override: bool = False) -> DeviceCodegen:
        """Register `codegen` for `target_kind`; the same name twice raises unless override."""
        if not isinstance(codegen, DeviceCodegen):
            raise TypeError(f"Expected a DeviceCodegen for target kind {target_kind!r}, got {codegen!r}")
        with self._lock:
            entries = self._codegens.setdefault(target_kind, [])
            for index, existing in enumerate(entries):
                if existing.name == codegen.name:
                    if not override:
                        raise ValueError(
                            f"Device codegen {codegen.name!r} is already registered for target kind "
                            f"{target_kind!r}. Pass override=True to replace it."
                        )
                    entries[index] = codegen
                    self.version += 1
                    return codegen
            entries.append(codegen)
            self.version += 1
        return codegen

    def register_lazy(self, target_kind: str, import_path: str) -> None:
        """Import `import_path` when `target_kind` is first used; it registers its codegens."""
        with self._lock:
            paths = self._lazy.setdefault(target_kind, [])
            if import_path not in paths:
                paths.append(import_path)
                self.version += 1

    def _load_lazy(self, target_kind: str) -> None:
        if target_kind not in self._lazy:
            return
        with self._lock:
            paths = self._lazy.get(target_kind, [])
            while paths:
                path = paths[0]
                try:
                    importlib.import_module(path)
                except ImportError as err:
                    # Left in the list, so a later call retries (e.g. after installing the backend).
                    raise ImportError(
                        f"Failed to import device codegen module {path!r} registered for target "
                        f"kind {target_kind!r}: {err}"
                    ) from err
                paths.pop(0)
            self._lazy.pop(target_kind, None)

    def registered(self, target_kind: str) -> list[DeviceCodegen]:
        """Codegens registered so far for a kind, without importing lazy backends."""
        with self._lock:
            return list(self._codegens.get(target_kind, ()))

    def codegens_for_kind(self, target_kind: str) -> list[DeviceCodegen]:
        """All codegens registered for a kind, in registration order (lazy ones loaded)."""
        self._load_lazy(target_kind)
        with self._lock:
            return list(self._codegens.get(target_kind, ()))

    def kinds(self) -> list[str]:
        """Every target kind with a codegen or a lazy registration."""
        with self._lock:
            return sorted(set(self._codegens) | set(self._lazy))

    def allowed(self, target: TargetLike) -> list[str]:
        """Names of the codegens that match `target`, in registration order."""
        target = as_target(target)
        return [c.name for c in self.codegens_for_kind(target.kind.name) if c.matches(target)]

    def resolve(self, target: TargetLike) -> DeviceCodegen:
        """The first codegen that matches `target`; ValueError naming what is available."""
        target = as_target(target)
        kind = target.kind.name
        entries = self.codegens_for_kind(kind)
        for codegen in entries:
            if codegen.matches(target):
                return codegen
        if entries:
            raise ValueError(
                f"No device codegen registered for target kind {kind!r} matches target "
                f"{target}. Registered for {kind!r}: {[c.name for c in entries]}."
            )
        raise ValueError(
            f"No device codegen registered for target kind {kind!r}. "
            f"Available target kinds: {self.kinds()}."
        )


default_registry = DeviceCodegenRegistry()


def register_device_codegen(target_kind: str, codegen: DeviceCodegen, *, override: bool = False) -> DeviceCodegen:
    """Register a device codegen entry for a target kind."""
    return default_registry.register(target_kind, codegen, override=override)


def register_lazy_device_codegen(target_kind: str, import_path: str) -> None:
    """Register a backend module to import when its target kind is first used."""
    default_registry.register_lazy(target_kind, import_path)


def allowed_device_codegens_for_target(target: TargetLike) -> list[str]:
    """Return matching device codegen names for a target."""
    return default_registry.allowed(target)


def resolve_device_codegen(target: TargetLike) -> DeviceCodegen:
    """Resolve a device codegen entry from a TVM target."""
    return default_registry.resolve(target)
