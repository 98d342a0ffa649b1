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

import json
import logging
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import tvm
import tvm.s_tir  # noqa: F401  registers the schedule passes the default pipeline uses
import tvm_ffi
import xxhash
from tvm import ir
from tvm.ir import IRModule
from tvm.runtime import Module
from tvm.target import Target
from tvm.tirx import PrimFunc
from tvm.tirx.build import split_host_device_mods
from tvm_ffi import DLDeviceType

from ._artifacts import frame, unframe
from ._cache import CodegenCache
from ._context import active_cache
from ._errors import ArtifactError
from ._key import CacheKey, _encode_part, ir_hash, static_salts
from ._outcome import _emit_fields
from ._registry import DeviceCodegen, DeviceCodegenRegistry, default_registry
from ._store import STORAGE_ERRORS, ArtifactStore
from ._targets import canonical_target

__all__ = ["BuildPart", "BuildRecord", "build", "build_key", "build_with_record"]

logger = logging.getLogger(__name__)

# Bump when the index entry's layout or the build key's parts change.
INDEX_FORMAT = "1"
INDEX_CODEC = "build-index"
INDEX_SIZE_LIMIT = 64 << 20
# Function targets of these kinds stay in the host module (tvm.tirx.build's is_host_func).
_HOST_KINDS = frozenset({"llvm", "c", "cuda_host"})
_MEMO_PREFIX = "build:"
_INDEX_ERRORS = (*STORAGE_ERRORS, TypeError, ArtifactError)

_index_stores: weakref.WeakKeyDictionary[CodegenCache, ArtifactStore] = weakref.WeakKeyDictionary()
_index_lock = threading.Lock()
_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class BuildPart:
    """One codegen call of a build: which codegen, in which mode, and its cache key digest."""

    role: str  # "device" or "host"
    kind: str
    codegen: str
    mode: str  # "compiled" or "source"
    digest: str | None  # None when built without a cache

    def as_dict(self) -> dict[str, str | None]:
        """JSON-ready form, as kept in an index entry."""
        return {"role": self.role, "kind": self.kind, "codegen": self.codegen, "mode": self.mode,
                "digest": self.digest}


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
        key = _key_of(plan, registry)
        if key is not None:
            served = _warm(cache, key, plan, start)
            if served is not None:
                return served
    module, host, devices = _cold(cache, registry, plan)
    if cache is None:
        return module, BuildRecord("uncached", None, host, devices)
    record = BuildRecord("built", key, host, devices)
    if key is not None and all(p.digest is not None for p in (host, *devices)):
        _write_index(cache, key, host, devices)
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
    host: Target | str = "llvm" if _runtime_enabled("llvm") else "c"
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


@lru_cache(maxsize=64)
def _runtime_enabled(kind: str) -> bool:
    """Whether TVM's runtime for `kind` is loaded here (fixed for the life of the process)."""
    try:
        return bool(tvm.runtime.enabled(kind))
    except (RuntimeError, ValueError):  # kinds TVM has no optional runtime for (c, webgpu)
        return False


def _compile_device(entry: DeviceCodegen, target: Target) -> bool:
    """The mode tvm.tirx.build gets for this target: compiled where TVM could load the result.

    target.build.cuda silently returns source-only where no CUDA driver is loaded; a codegen with
    both modes is therefore asked to compile only where the target kind's runtime is enabled.
    A codegen with one mode gets that mode.
    """
    if entry.supports_mode(True) and entry.supports_mode(False):
        return _runtime_enabled(target.kind.name)
    return entry.supports_mode(True)


# ---- the build key ---------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Target):
        return canonical_target(value)
    if isinstance(value, tvm_ffi.Object):
        return tvm.ir.save_json(value)
    return str(value)


# PassContext objects are immutable; the one in force is usually the same from call to call.
_last_context: list[tuple[object, str | None]] = []


def _pass_context_part() -> str | None:
    """The PassContext as canonical JSON, or None when it has instruments (they must see passes)."""
    ctx = tvm.transform.PassContext.current()
    last = _last_context[0] if _last_context else None
    if last is not None and last[0].same_as(ctx):  # type: ignore[attr-defined]
        return last[1]
    if len(ctx.instruments):
        text = None
    else:
        config = {str(k): _jsonable(v) for k, v in ctx.config.items()}
        text = json.dumps({"opt_level": int(ctx.opt_level), "config": config,
                           "required": sorted(str(p) for p in ctx.required_pass),
                           "disabled": sorted(str(p) for p in ctx.disabled_pass)},
                          sort_keys=True, separators=(",", ":"))
    _last_context[:] = [(ctx, text)]
    return text


_CODEGENS_MAX = 1024
_codegens_json: dict[tuple, str] = {}


def _codegens_part(plan: _Plan, registry: DeviceCodegenRegistry) -> str:
    """Codegen name, mode, toolchain and salt of every target the build may call a codegen for.

    Resolved on every call (a codegen may be registered, or an env var a toolchain reads set,
    between two builds); only the JSON text is memoized.
    """
    targets = [plan.host]
    for candidate in (plan.bind, *plan.func_targets):
        if candidate.kind.name not in _HOST_KINDS:
            targets.append(candidate)
    rows = set()
    for target in targets:
        entry = registry.resolve(target)
        compiled = _compile_device(entry, target)
        toolchain = tuple(sorted(entry.toolchain(target, compiled).items())) if entry.toolchain is not None else ()
        rows.add((canonical_target(target), entry.name, compiled, toolchain, entry.salt))
    memo = tuple(sorted(rows))
    text = _codegens_json.get(memo)
    if text is None:
        text = json.dumps([{"target": t, "codegen": c, "mode": "compiled" if m else "source",
                            "toolchain": dict(tc), "salt": salt} for t, c, m, tc, salt in memo],
                          sort_keys=True, separators=(",", ":"))
        if len(_codegens_json) >= _CODEGENS_MAX:
            _codegens_json.clear()
        _codegens_json[memo] = text
    return text


# The parts after the input's hash repeat across builds; encode them once per combination.
_TAILS_MAX = 1024
_tails: dict[tuple, tuple[tuple[tuple[str, str], ...], bytes]] = {}
_INPUT_PREFIX = _encode_part("input", "0" * 16)[:-16]


def build_key(mod: PrimFunc | IRModule, target: str | Target | None = None, pipeline: str | None = "default",
              *, registry: DeviceCodegenRegistry | None = None) -> CacheKey | None:
    """The build key of `mod` (the input module) in the current PassContext; None when not keyable.

    Parts, in order: input (structural hash of the input IRModule, map_free_vars=True), target
    (the target bound, with its host, canonical), pipeline_target, pipeline, pass_context
    (opt_level, config, required and disabled passes), the static salts, codegens (name, mode,
    toolchain and salt of each codegen the build may call), index_format. Not keyable: a
    PassContext with instruments (they must see the passes run) and an unhashable module.
    """
    return _key_of(_plan(mod, target, pipeline), default_registry if registry is None else registry)


def _key_of(plan: _Plan, registry: DeviceCodegenRegistry) -> CacheKey | None:
    context = _pass_context_part()
    if context is None:
        return None
    if not plan.hashed:
        try:
            plan.hashed.append(ir_hash(plan.mod))
        except (TypeError, ValueError) as err:
            _warn_once("hash", "codegen_cache.build: cannot hash the input module (%s); "
                       "building without the index", err)
            return None
    # The pipeline's target only picks the pipeline when none is named (beyond that, the host
    # it implies is in the bound target).
    pipeline_target = plan.target if plan.pipeline is None else None
    memo = (plan.bind, pipeline_target, plan.pipeline, context, _codegens_part(plan, registry))
    found = _tails.get(memo)
    if found is None:
        parts = (
            ("target", canonical_target(plan.bind)),
            ("pipeline_target", canonical_target(pipeline_target) if pipeline_target is not None else ""),
            ("pipeline", plan.pipeline if plan.pipeline is not None else "<default for target>"),
            ("pass_context", context),
            *static_salts(),
            ("codegens", memo[-1]),
            ("index_format", INDEX_FORMAT),
        )
        found = (parts, b"".join(_encode_part(n, v) for n, v in parts))
        if len(_tails) >= _TAILS_MAX:
            _tails.clear()
        _tails[memo] = found
    tail_parts, tail_bytes = found
    input_part = ("input", f"{plan.hashed[0] & 0xFFFFFFFFFFFFFFFF:016x}")
    digest = xxhash.xxh3_128_hexdigest(_INPUT_PREFIX + input_part[1].encode() + tail_bytes)
    return CacheKey((input_part, *tail_parts), digest)


# ---- warm path: memory, then the index --------------------------------------------------------


def _warm(cache: CodegenCache, key: CacheKey, plan: _Plan, start: float) -> tuple[Module, BuildRecord] | None:
    key_seconds = time.perf_counter() - start
    memo = cache.lookup_digest(_MEMO_PREFIX + key.digest, None, ir=plan.original)
    if memo is not None:
        record = memo[1]["record"]
        _emit("memory", key, key_seconds, start)
        return memo[0], BuildRecord("memory", key, record.host, record.devices)
    index = _read_index(cache, key)
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
    compiled = _compile_device(entry, target)
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


# ---- the index: <dir>/builds/, build key -> the digests of the build's parts -----------------


def _index_store(cache: CodegenCache) -> ArtifactStore:
    with _index_lock:
        store = _index_stores.get(cache)
        if store is None:
            store = ArtifactStore(cache.directory / "builds", size_limit=INDEX_SIZE_LIMIT)
            _index_stores[cache] = store
        return store


def index_store(cache: CodegenCache) -> ArtifactStore:
    """The store of build-index entries of `cache` (`<dir>/builds/`), for tools and tests."""
    return _index_store(cache)


def _write_index(cache: CodegenCache, key: CacheKey, host: BuildPart, devices: Sequence[BuildPart]) -> None:
    meta = {"key": key.digest, "parts": key.as_dict(), "host": host.as_dict(),
            "devices": [p.as_dict() for p in devices], "created": time.time()}
    try:
        _index_store(cache).put(key.digest, frame(INDEX_CODEC, meta, []))
    except _INDEX_ERRORS as err:
        _warn_once("index-write", "codegen_cache.build: cannot write the build index (%s: %s); "
                   "builds still work, warm builds lower again", type(err).__name__, err)


def _read_index(cache: CodegenCache, key: CacheKey) -> tuple[BuildPart, tuple[BuildPart, ...]] | None:
    store = _index_store(cache)
    try:
        blob = store.get(key.digest)
    except _INDEX_ERRORS as err:
        _warn_once("index-read", "codegen_cache.build: cannot read the build index (%s: %s)", type(err).__name__, err)
        return None
    if blob is None:
        return None
    try:
        art = unframe(blob)
        if art.codec != INDEX_CODEC or art.meta.get("key") != key.digest:
            raise ArtifactError(f"codec {art.codec!r} with key {str(art.meta.get('key'))[:16]}", kind=INDEX_CODEC)
        host = _part(art.meta.get("host"))
        devices = art.meta.get("devices")
        if not isinstance(devices, list):
            raise ArtifactError("devices is not a list", kind=INDEX_CODEC)
        return host, tuple(_part(d) for d in devices)
    except ArtifactError as err:
        _warn_once("index-corrupt", "codegen_cache.build: dropping a bad build-index entry %s: %s", key.digest[:16], err)
        try:
            store.delete(key.digest)
        except _INDEX_ERRORS:
            pass  # a miss either way; the next cold build overwrites it
        return None


def _part(value: object) -> BuildPart:
    fields = ("role", "kind", "codegen", "mode", "digest")
    if not isinstance(value, dict) or not all(isinstance(value.get(f), str) for f in fields):
        raise ArtifactError(f"malformed part {str(value)[:80]}", kind=INDEX_CODEC)
    if value["mode"] not in ("compiled", "source"):
        raise ArtifactError(f"unknown mode {value['mode']!r}", kind=INDEX_CODEC)
    return BuildPart(*(value[f] for f in fields))


def _warn_once(kind: str, msg: str, *args: object) -> None:
    if kind in _warned:
        logger.debug(msg, *args)
        return
    _warned.add(kind)
    logger.warning(msg, *args)
