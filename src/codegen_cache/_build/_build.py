"""codegen_cache.build: tvm.tirx.build with every codegen call through the registry and the cache.

The cold path follows tvm/tirx/build.py step by step (targets, BindTarget, the TIR pipeline,
split_host_device_mods, the finalize passes, SkipAssert under `tirx.disable_assert`, device
modules built before the host, imports last); each `target.build.<kind>` call is replaced by
the registry's codegen for that target, looked up through the active cache.

The warm path skips lowering: a *build key* over the input module (its structural hash), the
targets, the pipeline, the PassContext and the codegens' salts points, through an index kept
in the cache's `index` store, at the device-level entries of that build. A build served from
the index reads those entries by digest; a build repeated in one process is one memory hit.

Counted as one call in the row "build/build" (_cache/_stats.py): a hit with the build's codegen
seconds, or a miss whose lowerings count only their work (codegen runs, stores). A build the
key cannot hold is not counted here (its outcome is "uncached"): its lowerings count as calls.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from .._compat import tvm, IRModule, Module, PrimFunc, Target

from .._cache import CodegenCache
from .._cache._cache import fresh_results_are_the_callers, store_in_every_tier
from .._cache._stats import counted_as_one
from .._cache._writer import writer
from .._context import active_cache
from .._key import CacheKey
from .._outcome import emit, last_outcome
from .._registry import DeviceCodegenRegistry, default_registry
from ._index import BuildPart, compile_device, key_of, read_index, write_index
from ._plan import Plan, prepare_plan, plan

__all__ = ["BuildPart", "BuildRecord", "build", "build_key", "build_with_record", "capture_builds", "serve_parts"]

logger = logging.getLogger(__name__)

_MEMO_PREFIX = "build:"
# The row a build's one count goes to (Outcome.codegen and .mode of a build).
_ROW = ("build", "build")
# Set by whoever needs to know which builds ran inside a call (the model-level cache of Relax
# compiles: relax.build calls tvm.tirx.build for its library): each build appends (record, module).
_captured: contextvars.ContextVar[list[tuple[BuildRecord, Module]] | None] = contextvars.ContextVar(
    "codegen_cache_captured_builds", default=None)


@contextlib.contextmanager
def capture_builds() -> Iterator[list[tuple[BuildRecord, Module]]]:
    """Collect (record, module) of every build_with_record call in this context inside the block."""
    found: list[tuple[BuildRecord, Module]] = []
    token = _captured.set(found)
    try:
        yield found
    finally:
        _captured.reset(token)


class BuildRecord(NamedTuple):
    """How a build was served: tier ('memory', 'disk', 'codegen', 'uncached': as Outcome.tier), its key, its parts.

    codegen_seconds: the codegen time of the build's parts (for a hit: what serving it saved).
    A NamedTuple, not a frozen dataclass (docs/benchmarks.md at 5788f7c, "Records made at import").
    """

    tier: str
    key: CacheKey | None
    host: BuildPart
    devices: tuple[BuildPart, ...]
    codegen_seconds: float = 0.0


def build(mod: PrimFunc | IRModule, target: str | Target | None = None, pipeline: str | None = "default") -> Module:
    """tvm.tirx.build through the registry and the active cache (see docs/tvm-build.md)."""
    return build_with_record(mod, target, pipeline)[0]


def build_with_record(mod: PrimFunc | IRModule, target: str | Target | None = None,
                      pipeline: str | None = "default") -> tuple[Module, BuildRecord]:
    """Like build(), also returning how the module was served and the digests of its parts."""
    module, record = _build_with_record(mod, target, pipeline)
    captured = _captured.get()
    if captured is not None:
        captured.append((record, module))
    return module, record


def _build_with_record(mod: PrimFunc | IRModule, target: str | Target | None,
                       pipeline: str | None) -> tuple[Module, BuildRecord]:
    start = time.perf_counter()
    planned = plan(mod, target, pipeline)
    cache = active_cache()
    if cache is not None and (not isinstance(cache, CodegenCache) or cache.settings.disable or not cache.trusted):
        cache = None  # a cache of another kind serves DeviceCodegen.lower only; a disabled or untrusted one nothing
    registry = cache.registry if cache is not None else default_registry
    key = None
    if cache is not None:
        key = key_of(planned, registry)
        if key is not None:
            served = _warm(cache, key, planned, start)
            if served is not None:
                return served
    if cache is None:
        module, host, devices, seconds = _cold(cache, registry, planned)
        total = time.perf_counter() - start
        emit(tier="uncached", key="", codegen="build", mode="build", key_seconds=0.0, load_seconds=0.0,
             codegen_seconds=seconds, total_seconds=total, stored=False)
        return module, BuildRecord("uncached", None, host, devices, seconds)
    # The background writer waits until the build returns (docs/benchmarks.md at 5788f7c: a cold build's
    # cost over TVM's); every entry is staged before that.
    with writer.hold():
        return _cold_build(cache, registry, planned, key, start)


def _cold_build(cache: CodegenCache, registry: DeviceCodegenRegistry, planned: Plan, key: CacheKey | None,
                start: float) -> tuple[Module, BuildRecord]:
    if key is None:
        # Not keyable as a whole: not counted as a build; each lowering counts as its own call.
        module, host, devices, seconds = _cold(cache, registry, planned)
        emit(tier="uncached", key="", codegen="build", mode="build", key_seconds=0.0, load_seconds=0.0,
             codegen_seconds=seconds, total_seconds=time.perf_counter() - start, stored=False)
        return module, BuildRecord("uncached", None, host, devices, seconds)
    cache.counters.add_call(*_ROW, "misses")
    with counted_as_one():
        module, host, devices, seconds = _cold(cache, registry, planned)
    record = BuildRecord("codegen", key, host, devices, seconds)
    stored = all(p.digest is not None for p in (host, *devices))
    if stored:
        write_index(cache, key, host, devices, seconds)
        _remember(cache, key, module, planned, record)
    total = time.perf_counter() - start
    emit(tier="codegen", key=key.digest, codegen="build", mode="build", key_seconds=0.0,
         load_seconds=0.0, codegen_seconds=seconds, total_seconds=total, stored=stored)
    return module, record


def build_key(mod: PrimFunc | IRModule, target: str | Target | None = None, pipeline: str | None = "default",
              *, registry: DeviceCodegenRegistry | None = None) -> CacheKey | None:
    """The build key of `mod` (the input module) in the current PassContext; None when not keyable.

    Parts, in order: input (structural hash of the input IRModule, map_free_vars=True, with
    independent stores in one order: _build/_input_hash.py), target
    (the target bound, with its host, canonical), pipeline_target, pipeline, pass_context
    (opt_level, config, required and disabled passes), the static salts, codegens (name, mode,
    toolchain and salt of each codegen the build may call), index_format. Not keyable: a
    PassContext with instruments (they must see the passes run), an unhashable module, and a
    codegen that reads a user's callback without a declared salt (docs/key.md).
    """
    return key_of(plan(mod, target, pipeline), default_registry if registry is None else registry)


# ---- warm path: memory, then the index --------------------------------------------------------


def _warm(cache: CodegenCache, key: CacheKey, planned: Plan, start: float) -> tuple[Module, BuildRecord] | None:
    key_seconds = time.perf_counter() - start
    memo = cache.fetch_kept(_MEMO_PREFIX + key.digest, ir=planned.original, count=False)
    if memo is not None:
        record: BuildRecord = memo[1]["record"]
        _served(cache, "memory", key, key_seconds, start, record.codegen_seconds)
        return memo[0], BuildRecord("memory", key, record.host, record.devices, record.codegen_seconds)
    index = read_index(cache, key)
    if index is None:
        return None
    host, devices, seconds = index
    module = serve_parts(cache, host, devices)
    if module is None:
        return None
    record = BuildRecord("disk", key, host, devices, seconds)
    _remember(cache, key, module, planned, record)
    _served(cache, "disk", key, key_seconds, start, seconds)
    return module, record


def serve_parts(cache: CodegenCache, host: BuildPart, devices: tuple[BuildPart, ...], *,
                named_exactly: bool = False) -> Module | None:
    """The module a build made, from its parts' entries (device modules imported), or None if one is missing.

    The parts are not counted: they are what the caller's one hit served. named_exactly: the
    parts were named by an entry verify=True checked exactly (CodegenCache.fetch).
    """
    modules = []
    for part in devices:
        found = cache.fetch(part.digest, part.mode, count=False, named_exactly=named_exactly)
        if found is None:
            return None
        modules.append(found[0])
    # The host module gets the device modules as imports: it must be a copy nobody else holds.
    found = cache.fetch(host.digest, host.mode, fresh=bool(modules), count=False, named_exactly=named_exactly)
    if found is None:
        return None
    module = found[0]
    for device_module in modules:
        module.import_module(device_module)
    return module


def _remember(cache: CodegenCache, key: CacheKey, module: Module, planned: Plan, record: BuildRecord) -> None:
    # A PrimFunc cannot change; an IRModule can (mod["main"] = ...), so a copy is compared later.
    original = planned.original if isinstance(planned.original, PrimFunc) else planned.original.clone()
    # In-process only, so the meta may hold the record object; nothing here is ever serialized.
    cache.keep(_MEMO_PREFIX + key.digest, module, original, {"key": key.digest, "record": record})


def _served(cache: CodegenCache, tier: str, key: CacheKey, key_seconds: float, start: float, saved: float) -> None:
    """A build served whole: one hit of `tier` saving the build's codegen seconds, counted as its outcome says."""
    cache.counters.add_hit(*_ROW, tier, saved)
    total = time.perf_counter() - start
    emit(tier=tier, key=key.digest, codegen="build", mode="build", key_seconds=key_seconds,
         load_seconds=total - key_seconds, codegen_seconds=saved, total_seconds=total)


# ---- cold path: tvm.tirx.build's steps 3-6 and tir_to_runtime -------------------------------


def _cold(cache: CodegenCache | None, registry: DeviceCodegenRegistry, planned: Plan):
    host_all, device_mods = prepare_plan(planned)
    if tvm.ir.transform.PassContext.current().config.get("tirx.disable_assert", False):
        skip = tvm.tirx.transform.SkipAssert()
        host_all, device_mods = skip(host_all), [(t, skip(m)) for t, m in device_mods]
    return _codegens(cache, registry, planned, host_all, device_mods)


def _codegens(cache: CodegenCache | None, registry: DeviceCodegenRegistry, planned: Plan, host_all: IRModule,
              device_mods: list):
    # tir_to_runtime: device modules first, then the host module, then the imports.
    device_modules, device_parts, seconds = [], [], 0.0
    for device_target, device_mod in device_mods:
        module, part, spent = _codegen(cache, registry, device_mod, device_target, "device")
        device_modules.append(module)
        device_parts.append(part)
        seconds += spent
    if device_modules and cache is not None:
        # The host module gets the device modules as imports: a miss's fresh module is ours alone.
        with fresh_results_are_the_callers():
            host_module, host_part, spent = _codegen(cache, registry, host_all, planned.host, "host")
        fresh = last_outcome().tier in ("codegen", "uncached")
    else:
        host_module, host_part, spent = _codegen(cache, registry, host_all, planned.host, "host")
        fresh = True
    seconds += spent
    if device_modules and not fresh:
        host_module = _private_host(cache, registry, host_module, host_part, host_all, planned.host)
    for device_module in device_modules:
        host_module.import_module(device_module)
    return host_module, host_part, tuple(device_parts), seconds


def _call(codegen: Any, mod: IRModule, target: Target, compiled: bool) -> Module:
    return (codegen.build if compiled else codegen.build_without_compile)(mod, target)


def _codegen(cache: CodegenCache | None, registry: DeviceCodegenRegistry, mod: IRModule, target: Target,
             role: str) -> tuple[Module, BuildPart, float]:
    """tvm.tirx.build's codegen_build (SkipAssert applied by the caller), with the registry's codegen and the cache."""
    codegen = registry.resolve(target)
    compiled = compile_device(codegen, target)
    mode = "compiled" if compiled else "source"
    if cache is None:
        t0 = time.perf_counter()
        module = _call(codegen, mod, target, compiled)
        return module, BuildPart(role, target.kind.name, codegen.name, mode, None), time.perf_counter() - t0
    with store_in_every_tier():  # the build's index needs each part stored, cheap or not
        module, outcome = cache.lower_with_outcome(mod, target, compile_device=compiled, codegen=codegen)
    # An entry that was not stored (a mutating codegen, a collision, a skipped store) cannot be indexed.
    digest = outcome.key if (outcome.hit or outcome.stored) else None
    return module, BuildPart(role, target.kind.name, codegen.name, mode, digest), outcome.codegen_seconds


def _private_host(cache: CodegenCache | None, registry: DeviceCodegenRegistry, module: Module, part: BuildPart,
                  mod: IRModule, target: Target) -> Module:
    """A host module this build may add imports to, which no cache tier holds."""
    if cache is None:
        return module  # straight from the codegen: nobody else has it
    if part.digest is not None:
        # Staged before lower() returned; read back as a new object (not counted: not a hit).
        found = cache.fetch(part.digest, part.mode, fresh=True, count=False)
        if found is not None:
            return found[0]
    # The entry could not be stored (or read back): a second, uncached codegen call.
    logger.debug("codegen_cache.build: host entry %s not readable; calling %r again for a private copy",
                 part.digest, part.codegen)
    return _call(registry.resolve(target), mod, target, part.mode == "compiled")
