"""The device codegen registry: the API and behaviour of tilelang.backend.device_codegen.

Behaviour kept from tilelang commit 607a9144c (docs/codegens.md has the full table): entries are
any object with DeviceCodegen's attributes; `override=True` removes the old entry and appends the
new one at the end of the kind's list; each kind has ONE lazy import path (a later call replaces
it), imported on the kind's first use, whose import errors propagate raw and are retried on the
next use; `matches` returns the predicate's own value; messages start with the original's text.

Extensions: a registry is a class (tests build a fresh one); targets may be given as a dict or a
string; DeviceCodegen has `toolchain` and `salt` for the cache key, and `lower` goes through the
cache. The built-in codegens of the stock TVM kinds are kept apart (`register_builtin_family`):
never in the lazy slot, never in the registered lists; they come after every registered codegen
of their kind and give way to one of the same name. So where a registered codegen matches, every
answer is the original's; a stock kind where nothing registered matches resolves to its built-in
instead of raising. compile_device must be a bool (the one deliberate difference).
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module  # module-level name: tilelang's own tests patch it
from typing import TYPE_CHECKING, Any

from . import _compat
from ._context import active_cache
from ._forksafe import on_fork_child
from ._log import warn_once
from ._outcome import run_uncached
from ._targets import TargetLike, as_target

if TYPE_CHECKING:
    from ._compat import IRModule, Module, Target

__all__ = [
    "DeviceCodegen",
    "DeviceCodegenFunc",
    "DeviceCodegenRegistry",
    "TargetPredicate",
    "allowed_device_codegens_for_target",
    "call_codegen_function",
    "check_prepared",
    "codegen_function",
    "default_registry",
    "global_func_device_codegen",
    "in_codegen_call",
    "register_device_codegen",
    "register_lazy_device_codegen",
    "resolve_device_codegen",
    "route_global",
    "unroute_global",
]

logger = logging.getLogger(__name__)

DeviceCodegenFunc = Callable[["IRModule", "Target"], "Module"]
TargetPredicate = Callable[["Target"], bool]
# What a codegen adds to its cache key: toolchain versions, env vars it reads, its own salt.
ToolchainFunc = Callable[["Target", bool], Mapping[str, str]]


def _add_note(err: BaseException, note: str) -> None:
    if sys.version_info >= (3, 11):  # BaseException.add_note is new in 3.11
        err.add_note(note)


# While codegen_cache.enable() is on, TVM's `target.build.<kind>` names hold the switch's router,
# which sends every call through the cache: name -> (router, the function it replaced). A codegen
# that calls the name must reach the replaced function, or it would call itself through the cache.
_routed: dict[str, tuple[Any, Any]] = {}
# The global codegen functions this thread is calling for a codegen now: a router reached from
# inside one (a user's function registered over the router, which calls the function it found
# there) hands the call to TVM's function instead of going through the cache again.
_calling = threading.local()


def route_global(name: str, router: Any, replaced: Any) -> None:
    """Record that `router` now stands under TVM global function `name` in place of `replaced`."""
    _routed[name] = (router, replaced)


def unroute_global(name: str) -> None:
    """Forget the router of `name` (the switch put the replaced function back)."""
    _routed.pop(name, None)


def in_codegen_call(name: str) -> bool:
    """Whether this thread is inside a codegen's call of the global function `name`."""
    return name in getattr(_calling, "names", ())


def codegen_function(name: str, *, missing_ok: bool = False) -> Any:
    """The TVM global function `name` as a codegen must call it: what is registered, unless that is the switch's router.

    A function registered over the router (a user's own target.build.llvm) is called as registered.
    """
    # Called as the original module calls it (tilelang's own tests patch tvm_ffi.get_global_func).
    get = _compat.tvm_ffi.get_global_func
    func = get(name, allow_missing=True) if missing_ok else get(name)
    routed = _routed.get(name)
    if routed is not None and func is not None and func.__chandle__() == routed[0].__chandle__():
        return routed[1]
    return func


def global_func_device_codegen(global_func_name: str) -> DeviceCodegenFunc:
    """Create a device codegen callback backed by a TVM global function."""
    if not isinstance(global_func_name, str) or not global_func_name:
        raise TypeError(f"global_func_name must be a TVM global function name such as 'target.build.cuda', "
                        f"got {global_func_name!r}")

    def build(mod: IRModule, target: Target) -> Module:
        # Looked up on every call, as the original does: a function registered later is found,
        # and an unknown name raises tvm_ffi's own ValueError("Cannot find global function ...").
        try:
            func = codegen_function(global_func_name)
        except ValueError as err:
            names = sorted(n for n in _compat.tvm_ffi.registry.list_global_func_names() if n.startswith("target.build."))
            _add_note(err, f"Registered codegen functions in this TVM build: {names}.")
            raise
        return call_codegen_function(global_func_name, func, mod, target)

    return build


def check_prepared(where: str, mod: Any) -> None:
    """A TypeError naming prepare_for_codegen when `mod` is a PrimFunc: a codegen takes the prepared module.

    Any other input goes on to the codegen as it is (the cache cannot key it), as in the original.
    """
    if isinstance(mod, _compat.PrimFunc):
        attrs = mod.attrs
        symbol = attrs.get("global_symbol") if attrs is not None else None
        named = f" {str(symbol)!r}" if symbol is not None else ""
        raise TypeError(
            f"{where} takes the IRModule a device codegen takes, got the PrimFunc{named}, unprepared: "
            "prepare it first, `mod, target = codegen_cache.prepare_for_codegen(func, target)` "
            "(TVM's TIR pipeline and host/device split), or build it whole with codegen_cache.build(func, target)"
        )


def call_codegen_function(name: str, func: Any, mod: Any, target: Any) -> Any:
    """func(mod, target), marked as this thread's codegen call of the global function `name`."""
    calling = getattr(_calling, "names", None)
    if calling is None:
        calling = _calling.names = []
    calling.append(name)
    try:
        return func(mod, target)
    finally:
        calling.pop()


@dataclass(frozen=True, slots=True)
class DeviceCodegen:
    """Device codegen entry points for one backend target variant."""

    name: str
    build: DeviceCodegenFunc | None = None
    build_without_compile: DeviceCodegenFunc | None = None
    supports_target: TargetPredicate | None = None
    # Extensions (keyword defaults keep the original's constructor unchanged):
    toolchain: ToolchainFunc | None = None
    salt: str = ""

    def __post_init__(self) -> None:
        # Fail at construction, naming the field, not at the first lowering with a bare AttributeError.
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"DeviceCodegen name must be a non-empty str, got {self.name!r}")
        for field in ("build", "build_without_compile", "supports_target", "toolchain"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise TypeError(f"DeviceCodegen {self.name!r}: {field} must be callable or None, got {value!r} "
                                f"of type {type(value).__name__}")
        if not isinstance(self.salt, str):
            raise TypeError(f"DeviceCodegen {self.name!r}: salt must be a str, got {type(self.salt).__name__}")

    def matches(self, target: Target) -> bool:
        """The predicate's own value for `target` (True without a predicate), as the original."""
        return True if self.supports_target is None else self.supports_target(target)

    def _func_for(self, target: Target, compile_device: bool) -> DeviceCodegenFunc:
        func = self.build if compile_device else self.build_without_compile
        if func is None:
            mode = "with compilation" if compile_device else "without compilation"
            raise ValueError(
                f"Device codegen '{self.name}' for target '{target.kind.name}' does not support lowering {mode}"
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
        # Deliberately stricter than the original (any truthy value compiles there): a string
        # such as "False" silently compiling is the bug this catches.
        if not isinstance(compile_device, bool):
            raise TypeError(
                f"compile_device must be a bool, got {compile_device!r} of type {type(compile_device).__name__}"
            )
        check_prepared("DeviceCodegen.lower", mod)
        target = as_target(target)
        self._func_for(target, compile_device)  # a missing mode is an error before any lookup
        cache = active_cache()
        if cache is None:
            return run_uncached(self.name, "compiled" if compile_device else "source",
                                lambda: self.invoke(mod, target, compile_device=compile_device), time.perf_counter())
        # The cache runs the codegen itself for inputs it cannot key (not an IRModule).
        return cache.lower(mod, target, compile_device=compile_device, codegen=self)


class DeviceCodegenRegistry:
    """Codegens per target kind, in registration order, plus lazily imported backends."""

    def __init__(self) -> None:
        # The original's three module globals, same shapes and meaning:
        self._codegens: dict[str, list[Any]] = {}  # _DEVICE_CODEGENS
        self._lazy: dict[str, str] = {}  # _LAZY_DEVICE_CODEGENS: one import path per kind
        self._loaded: set[str] = set()  # _LOADED_DEVICE_CODEGENS: kinds whose lazy path was imported
        # Extension: built-in families, apart from all of the above, and their loaded entries.
        self._builtins: dict[str, str] = {}
        self._builtin_codegens: dict[str, tuple[DeviceCodegen, ...]] = {}
        # Bumped on every change, so callers may memoize resolve() per target.
        self.version = 0
        # RLock: a lazily imported backend registers into this registry while we hold the lock.
        self._lock = threading.RLock()
        on_fork_child(self._renew_lock)

    def _renew_lock(self) -> None:
        self._lock = threading.RLock()  # a thread of the parent may have held it at the fork

    def register(self, target_kind: str, codegen: DeviceCodegen, *, override: bool = False) -> DeviceCodegen:
        """Register `codegen` for `target_kind`; the same name twice raises unless override."""
        _check_kind(target_kind)
        if not isinstance(getattr(codegen, "name", None), str) or not callable(getattr(codegen, "matches", None)):
            raise TypeError(f"codegen must be a DeviceCodegen (or an object with its name, matches and lower), "
                            f"got {codegen!r} of type {type(codegen).__name__}")
        with self._lock:
            entries = self._codegens.setdefault(target_kind, [])
            if override:
                # Removed and appended at the end, as the original: the kind's order changes.
                entries[:] = [item for item in entries if item.name != codegen.name]
            elif any(item.name == codegen.name for item in entries):
                raise ValueError(
                    f"Device codegen {codegen.name!r} is already registered for target kind {target_kind!r}. "
                    "Pass override=True to replace it (the new entry then goes to the end of the kind's list)."
                )
            entries.append(codegen)
            self.version += 1
        return codegen

    def register_lazy(self, target_kind: str, import_path: str) -> None:
        """Import `import_path` when `target_kind` is next used (replaces the kind's earlier path)."""
        _check_kind(target_kind)
        if not isinstance(import_path, str) or not import_path.strip():
            raise TypeError(f"import_path must be a module name such as 'my_backend.codegens', got {import_path!r}")
        with self._lock:
            self._lazy[target_kind] = import_path
            self._loaded.discard(target_kind)
            self.version += 1

    def register_builtin_family(self, target_kind: str, module: str) -> None:
        """Extension: `module.CODEGENS[target_kind]` back the kind, after every registered codegen."""
        with self._lock:
            self._builtins[target_kind] = module
            self._builtin_codegens.pop(target_kind, None)
            self.version += 1

    def _ensure_loaded(self, target_kind: str) -> None:
        if target_kind in self._loaded and (target_kind in self._builtin_codegens or target_kind not in self._builtins):
            return  # the hot path: no lock (set and dict lookups are atomic)
        with self._lock:
            if target_kind not in self._loaded:
                import_path = self._lazy.get(target_kind)
                if import_path is not None:
                    # Raw errors (ModuleNotFoundError with .name), as the original; the kind
                    # stays unloaded, so the next call retries (e.g. after installing it).
                    try:
                        import_module(import_path)
                    except ImportError as err:
                        # Raised unchanged (as the original); the log says what the bare error does not.
                        warn_once(logger, ("lazy-import", target_kind, import_path), "the lazy device codegen "
                                  "module %r of target kind %r does not import (%s: %s); every use of the kind "
                                  "fails until it does (the built-in %r codegens too). Fix it, or register "
                                  "another path for the kind: a later register_lazy_device_codegen call replaces "
                                  "this one.", import_path, target_kind, type(err).__name__, err, target_kind)
                        raise
                self._loaded.add(target_kind)
            if target_kind in self._builtins and target_kind not in self._builtin_codegens:
                family = importlib.import_module(self._builtins[target_kind])
                self._builtin_codegens[target_kind] = tuple(family.CODEGENS.get(target_kind, ()))
                self.version += 1

    def _entries(self, target_kind: str) -> list[DeviceCodegen]:
        # The registered codegens (the original's list), then the built-ins no registered name hides.
        with self._lock:
            entries = list(self._codegens.get(target_kind, ()))
            builtins = self._builtin_codegens.get(target_kind, ())
        if builtins:
            taken = {item.name for item in entries}
            entries += [codegen for codegen in builtins if codegen.name not in taken]
        return entries

    def registered(self, target_kind: str) -> list[DeviceCodegen]:
        """Codegens of a kind so far (built-ins last, if loaded), without importing anything."""
        return self._entries(target_kind)

    def codegens_for_kind(self, target_kind: str) -> list[DeviceCodegen]:
        """All codegens of a kind in resolution order: registered ones, then built-ins (lazy ones loaded)."""
        self._ensure_loaded(target_kind)
        return self._entries(target_kind)

    def kinds(self) -> list[str]:
        """Every target kind with a codegen, a lazy path or a built-in family."""
        with self._lock:
            return sorted(set(self._codegens) | set(self._lazy) | set(self._builtins))

    def _matching(self, target: Target) -> list[DeviceCodegen]:
        kind = target.kind.name
        found = []
        for codegen in self.codegens_for_kind(kind):
            try:
                accepted = codegen.matches(target)
            # Broad on purpose: the predicate is user code, and its exception propagates
            # unchanged (as the original's does); only a note naming the codegen is added.
            except Exception as err:
                _add_note(err, f"raised by the supports_target of device codegen {codegen.name!r} "
                               f"registered for target kind {kind!r}, for target {target}")
                raise
            if accepted:
                found.append(codegen)
        return found

    def allowed(self, target: TargetLike) -> list[str]:
        """Names of the codegens that match `target`, in registration order."""
        return [codegen.name for codegen in self._matching(as_target(target))]

    def resolve(self, target: TargetLike) -> DeviceCodegen:
        """The first codegen that matches `target`; ValueError naming what is available."""
        target = as_target(target)
        matches = self._matching(target)
        if matches:
            return matches[0]
        kind = target.kind.name
        names = [codegen.name for codegen in self.registered(kind)]
        message = f"No device codegen registered for target '{kind}'. Available: {', '.join(names) or '<none>'}."
        if names:
            message += f" None of them accepts target {target}."
        else:
            message += f" Target kinds with a device codegen: {', '.join(self.kinds()) or '<none>'}."
        raise ValueError(message)


def _check_kind(target_kind: object) -> None:
    if not isinstance(target_kind, str) or not target_kind:
        raise TypeError(f"target_kind must be a target kind name such as 'cuda', got {target_kind!r}")


default_registry = DeviceCodegenRegistry()
# The original's private globals, for code that reads or patches them (tilelang's own tests do).
_DEVICE_CODEGENS = default_registry._codegens
_LAZY_DEVICE_CODEGENS = default_registry._lazy
_LOADED_DEVICE_CODEGENS = default_registry._loaded


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
