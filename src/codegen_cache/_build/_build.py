"""codegen_cache.build: tvm.tirx.build with every codegen call through the registry and the cache.

The cold path follows tvm/tirx/build.py step by step (targets, BindTarget, the TIR pipeline,
split_host_device_mods, the finalize passes, SkipAssert under `tirx.disable_assert`, device
modules built before the host, imports last); each `target.build.<kind>` call is replaced by
the registry's codegen for that target, looked up through the active cache.

The warm path skips lowering: a *build key* over the input module (its structural hash), the
targets, the pipeline, the PassContext and the codegens' salts points, through an index kept
in `<dir>/builds/`, at the device-level entries of that build. A build served from the index
reads those entries by digest; a build repeated in one process is one memory hit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import tvm
import tvm.s_tir  # noqa: F401  registers the schedule passes the default pipeline uses
from tvm import ir
from tvm.ir import IRModule
from tvm.runtime import Module
from tvm.target import Target
from tvm.tirx import PrimFunc
from tvm.tirx.build import split_host_device_mods
from tvm_ffi import DLDeviceType

from ._index import (
    BuildPart,
    compile_device,
    index_store,
    key_of,
    read_index,
    runtime_enabled,
    write_index,
)
from .._cache._cache import CodegenCache
from .._context import active_cache
from .._key import CacheKey
from .._outcome import _emit_fields
from .._registry import DeviceCodegen, DeviceCodegenRegistry, default_registry

__all__ = ["BuildPart", "BuildRecord", "build", "build_key", "build_with_record", "index_store", "lower_plan"]

logger = logging.getLogger(__name__)

_MEMO_PREFIX = "build:"


@dataclass(frozen=True, slots=True)
class BuildRecord:
    """How a build was served: tier ('memory', 'disk', 'built', 'uncached'), its key, its parts."""

    tier: str
    key: CacheKey | None
    host: BuildPart
    devices: tuple[BuildPart, ...]


@dataclass(frozen=True, slots=True)
class _Plan:
    """The input and tvm.tirx.build's steps 0-2: the target to bind, the pipeline's target, the host."""

    mod: IRModule
    original: PrimFunc | IRModule  # what the caller passed: memory hits are compared with it
    func_targets: tuple[Target, ...]
    hashed: list[int]  # the input's structural hash once computed (shared by a PrimFunc's plans)
    bind: Target
    target: Target | None
    host: Target
    pipeline: str | None


def build(mod: PrimFunc | IRModule, target: str | Target | None = None, pipeline: str | None = "default") -> Module:
    """tvm.tirx.build through the registry and the active cache (see docs/tvm-build.md)."""
    return build_with_record(mod, target, pipeline)[0]


def build_with_record(mod: PrimFunc | IRModule, target: str | Target | None = None,
                      pipeline: str | None = "default") -> tuple[Module, BuildRecord]:
    """Like build(), also returning how the module was served and the digests of its parts."""
    start = time.perf_counter()
    plan = _plan(mod, target, pipeline)
    cache = active_cache()
    registry = cache.registry if cache is not None else default_registry
    key = None
    if cache is not None:
        key = key_of(plan, registry)
        if key is not None:
            served = _warm(cache, key, plan, start)
            if served is not None:
                return served
    module, host, devices = _cold(cache, registry, plan)
    if cache is None:
        return module, BuildRecord("uncached", None, host, devices)
    record = BuildRecord("built", key, host, devices)
    if key is not None and all(p.digest is not None for p in (host, *devices)):
        write_index(cache, key, host, devices)
        _remember(cache, key, module, plan, record)
    return module, record


# ---- the input and steps 0-2 of tvm.tirx.build -----------------------------------------------

# A PrimFunc cannot change once made (TVM copies on write while we hold a reference), so its
# IRModule, function targets and structural hash are kept by identity: a re-run that passes
# the same object skips the hash. IRModules can change in place (update, __setitem__): never.
_PRIMFUNC_MEMO_MAX = 256
_primfuncs: dict[int, tuple[PrimFunc, IRModule, tuple[Target, ...], list[int]]] = {}


def _func_targets(mod: IRModule) -> tuple[Target, ...]:
    found = []
    for func in mod.functions.values():
        f_target = func.attrs.get("target", None) if func.attrs is not None else None
        if isinstance(f_target, Target):
            found.append(f_target)
    return tuple(found)


def _input(mod: PrimFunc | IRModule) -> tuple[IRModule, PrimFunc | IRModule, tuple[Target, ...], list[int]]:
    """(IRModule, what memory hits compare with, function targets, [structural hash] once known)."""
    if isinstance(mod, PrimFunc):
        memo = _primfuncs.get(id(mod))
        if memo is not None and memo[0] is mod:
            return memo[1], mod, memo[2], memo[3]
        irmod = IRModule.from_expr(mod)
        memo = (mod, irmod, _func_targets(irmod), [])
        if len(_primfuncs) >= _PRIMFUNC_MEMO_MAX:
            _primfuncs.clear()
        _primfuncs[id(mod)] = memo
        return memo[1], mod, memo[2], memo[3]
    if not isinstance(mod, IRModule):
        raise TypeError(f"build expects a tvm.tirx.PrimFunc or a tvm.IRModule, got {type(mod).__name__}")
    return mod, mod, _func_targets(mod), []


def _plan(mod: PrimFunc | IRModule, target: str | Target | None, pipeline: str | None) -> _Plan:
    irmod, original, func_targets, hashed = _input(mod)
    if pipeline is not None and not isinstance(pipeline, str):
        # tvm.tirx.build asserts the same (a Pass object is not accepted there either).
        raise TypeError(f"pipeline must be a pipeline name or None, got {type(pipeline).__name__}")
    current = Target.current()
    bind = current if target is None else target
    bind = _target(bind if bind is not None else "llvm")
    chosen = current if target is None else target
    if chosen is None and func_targets:
        chosen = func_targets[0]
    chosen = _target(chosen) if chosen is not None else None
    host: Target | str = "llvm" if runtime_enabled("llvm") else "c"
    if chosen is not None:
        if chosen.host is not None:
            host = chosen.host
        elif chosen.get_target_device_type() == DLDeviceType.kDLCPU:
            host = chosen
    host = _target(host)
    return _Plan(irmod, original, func_targets, hashed, _with_host(bind, host), chosen, host, pipeline)


# Target construction and with_host cost tens of microseconds; the warm path is about that size.
@lru_cache(maxsize=256)
def _target_from_str(text: str) -> Target:
    return Target(text)


def _target(value: Any) -> Target:
    if isinstance(value, Target):
        return value
    if isinstance(value, str):
        return _target_from_str(value)
    return Target(value)


@lru_cache(maxsize=256)
def _with_host(target: Target, host: Target) -> Target:
    return target.with_host(host)


def build_key(mod: PrimFunc | IRModule, target: str | Target | None = None, pipeline: str | None = "default",
              *, registry: DeviceCodegenRegistry | None = None) -> CacheKey | None:
    """The build key of `mod` (the input module) in the current PassContext; None when not keyable.

    Parts, in order: input (structural hash of the input IRModule, map_free_vars=True), target
    (the target bound, with its host, canonical), pipeline_target, pipeline, pass_context
    (opt_level, config, required and disabled passes), the static salts, codegens (name, mode,
    toolchain and salt of each codegen the build may call), index_format. Not keyable: a
    PassContext with instruments (they must see the passes run) and an unhashable module.
    """
    return key_of(_plan(mod, target, pipeline), default_registry if registry is None else registry)


# ---- warm path: memory, then the index --------------------------------------------------------


def _warm(cache: CodegenCache, key: CacheKey, plan: _Plan, start: float) -> tuple[Module, BuildRecord] | None:
    key_seconds = time.perf_counter() - start
    memo = cache.lookup_digest(_MEMO_PREFIX + key.digest, None, ir=plan.original)
    if memo is not None:
        record = memo[1]["record"]
        _emit("memory", key, key_seconds, start)
        return memo[0], BuildRecord("memory", key, record.host, record.devices)
    index = read_index(cache, key)
    if index is None:
        return None
    host, devices = index
    modules = []
    for part in devices:
        found = cache.lookup_digest(part.digest, part.mode)
        if found is None:
            return None
        modules.append(found[0])
    # The host module gets the device modules as imports: it must be a copy nobody else holds.
    found = cache.lookup_digest(host.digest, host.mode, fresh=bool(modules))
    if found is None:
        return None
    module = found[0]
    for device_module in modules:
        module.import_module(device_module)
    record = BuildRecord("disk", key, host, devices)
    _remember(cache, key, module, plan, record)
    _emit("disk", key, key_seconds, start)
    return module, record


def _remember(cache: CodegenCache, key: CacheKey, module: Module, plan: _Plan, record: BuildRecord) -> None:
    # A PrimFunc cannot change; an IRModule can (mod["main"] = ...), so a copy is compared later.
    original = plan.original if isinstance(plan.original, PrimFunc) else plan.original.clone()
    # In-process only, so the meta may hold the record object; nothing here is ever serialized.
    cache.remember(_MEMO_PREFIX + key.digest, module, original, {"key": key.digest, "record": record})


def _emit(tier: str, key: CacheKey, key_seconds: float, start: float) -> None:
    total = time.perf_counter() - start
    _emit_fields(tier, key.digest, "build", "build", key_seconds, total - key_seconds, 0.0, total, None)


# ---- cold path: tvm.tirx.build's steps 3-6 and tir_to_runtime -------------------------------


def _cold(cache: CodegenCache | None, registry: DeviceCodegenRegistry, plan: _Plan):
    host_all, device_mods = lower_plan(plan)
    # tir_to_runtime: device modules first, then the host module, then the imports.
    device_modules, device_parts = [], []
    for device_target, device_mod in device_mods:
        module, part, _entry = _codegen(cache, registry, device_mod, device_target, "device")
        device_modules.append(module)
        device_parts.append(part)
    host_module, host_part, entry = _codegen(cache, registry, host_all, plan.host, "host")
    if device_modules:
        host_module = _private_host(cache, host_module, host_part, entry, host_all, plan.host)
        for device_module in device_modules:
            host_module.import_module(device_module)
    return host_module, host_part, tuple(device_parts)


def lower_plan(plan: _Plan) -> tuple[IRModule, list[tuple[Target, IRModule]]]:
    """Steps 3-6 of tvm.tirx.build: the host module and the non-empty device modules to build."""
    mod = tvm.tirx.transform.BindTarget(plan.bind)(plan.mod)
    if plan.pipeline is not None:
        passes, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline(plan.pipeline)
    else:
        passes, finalize_host, finalize_device = tvm.tirx.get_default_tir_pipeline(plan.target)
    mod = passes(mod)
    host_mod, device_mod_dict = split_host_device_mods(mod)
    host_mod = finalize_host()(host_mod)
    device_mods = [(t, finalize_device()(m)) for t, m in device_mod_dict.items()]
    host_all = ir.IRModule({}, attrs=host_mod.attrs)
    host_all.update(host_mod)
    return host_all, [(t, m) for t, m in device_mods if len(m.functions) != 0]


def _codegen(cache: CodegenCache | None, registry: DeviceCodegenRegistry, mod: IRModule, target: Target,
             role: str) -> tuple[Module, BuildPart, DeviceCodegen]:
    """tvm.tirx.build's codegen_build, with the registry's codegen and the cache."""
    if tvm.ir.transform.PassContext.current().config.get("tirx.disable_assert", False):
        mod = tvm.tirx.transform.SkipAssert()(mod)
    entry = registry.resolve(target)
    compiled = compile_device(entry, target)
    mode = "compiled" if compiled else "source"
    if cache is None:
        return entry.invoke(mod, target, compile_device=compiled), BuildPart(role, target.kind.name, entry.name, mode, None), entry
    module, outcome = cache.lower_with_outcome(mod, target, compile_device=compiled, codegen=entry)
    # An entry that was not stored (a mutating codegen, a collision, a skipped store) cannot be indexed.
    digest = outcome.key if (outcome.hit or outcome.stored) else None
    return module, BuildPart(role, target.kind.name, entry.name, mode, digest), entry


def _private_host(cache: CodegenCache | None, module: Module, part: BuildPart, entry: DeviceCodegen,
                  mod: IRModule, target: Target) -> Module:
    """A host module this build may add imports to, which no cache tier holds."""
    if cache is None:
        return module  # straight from the codegen: nobody else has it
    if part.digest is not None:
        cache.flush()  # the entry may still be queued for writing
        found = cache.lookup_digest(part.digest, part.mode, fresh=True)
        if found is not None:
            return found[0]
    # The entry could not be stored (or read back): a second, uncached codegen call.
    logger.debug("codegen_cache.build: host entry %s not readable; calling %r again for a private copy",
                 part.digest, entry.name)
    return entry.invoke(mod, target, compile_device=part.mode == "compiled")
