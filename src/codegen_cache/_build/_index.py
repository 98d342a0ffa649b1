"""The build key of codegen_cache.build, and its index: build key -> the build's entries.

An index entry lives in the cache's `index` store (`<dir>/index/`, owned, cleared, listed
and verified by the cache like its other stores) as framed bytes (codec "build-index", JSON
metadata, checksum; nothing pickled). It names each part of a build (host and device codegen
calls) by role, kind, codegen, mode and device-level key digest.

Whole-build entries (build index entries in the index store, compiled Relax models in the
compiled store, beside their libraries) are stored as a miss's device entries are: staged in
`<dir>/staged/index/` before the build returns (so they survive the process), moved into their
store by the background writer. Opening and writing SQLite on the
caller's thread was the largest part of what a cold build paid over TVM's own (docs/benchmarks.md at 5788f7c).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple, TypeVar

from .._compat import tvm, tvm_ffi
import xxhash
from .._compat import Target
from .. import _compat
from .._artifacts import Artifact, frame, unframe
from .._cache import CodegenCache
from .._errors import ArtifactError, CacheLinkError, UncacheableError
from .._key import CacheKey, _encode_part, encode_parts, static_salts
from ._input_hash import input_hash
from .._log import warn_once
from .._registry import DeviceCodegenRegistry
from .._storage._disk import STORAGE_ERRORS
from .._storage._layout import INDEX_CODEC
from .._targets import canonical_target
from ._plan import Plan
from ._reads import tvm_parts

__all__ = ["INDEX_CODEC", "INDEX_ERRORS", "INDEX_FORMAT", "BuildPart", "codegen_seconds_of", "codegens_json",
           "compile_device", "input_key", "key_of", "parse_part", "pass_context_part", "read_entry", "read_index", "write_entry",
           "write_index"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

# Bump when the index entry's layout or the build key's parts change.
INDEX_FORMAT = "3"
# Function targets of these kinds stay in the host module (tvm.tirx.build's is_host_func).
_HOST_KINDS = frozenset({"llvm", "c", "cuda_host"})
INDEX_ERRORS = (*STORAGE_ERRORS, TypeError, ArtifactError)


class BuildPart(NamedTuple):
    """One codegen call of a build: which codegen, in which mode, and its cache key digest.

    A NamedTuple, not a frozen dataclass: the class is made when the switch is imported
    (docs/benchmarks.md at 5788f7c, "Records made at import").
    """

    role: str  # "device" or "host"
    kind: str
    codegen: str
    mode: str  # "compiled" or "source"
    digest: str | None  # None when built without a cache

    def as_dict(self) -> dict[str, str | None]:
        """JSON-ready form, as kept in an index entry."""
        return {"role": self.role, "kind": self.kind, "codegen": self.codegen, "mode": self.mode,
                "digest": self.digest}


# ---- modes ------------------------------------------------------------------------------------


def compile_device(codegen: Any, target: Target) -> bool:
    """The mode tvm.tirx.build gets for this target: compiled where TVM could load the result.

    target.build.cuda silently returns source-only where no CUDA driver is loaded; a codegen with
    both modes is therefore asked to compile only where the target kind's runtime is enabled.
    An llvm target always compiles: LLVM builds it only where it can make the target's machine,
    and TVM then runs what it built (asking TVM whether the llvm runtime is enabled would make
    one more machine). A codegen with one mode gets that mode.
    """
    if codegen.build is not None and codegen.build_without_compile is not None:
        return target.kind.name == "llvm" or _compat.runtime_enabled(target.kind.name)
    return codegen.build is not None


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


def pass_context_part() -> str | None:
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


def _codegens_part(plan: Plan, registry: DeviceCodegenRegistry) -> str:
    """Codegen name, mode, toolchain and salt of every target the build may call a codegen for.

    Resolved on every call (a codegen may be registered, or an env var a toolchain reads set,
    between two builds); only the JSON text is memoized.
    """
    targets = [plan.host]
    for candidate in (plan.bind, *plan.func_targets):
        if candidate.kind.name not in _HOST_KINDS:
            targets.append(candidate)
    return codegens_json(targets, registry)


def codegens_json(targets: Sequence[Target], registry: DeviceCodegenRegistry) -> str:
    """The `codegens` key part: name, mode, toolchain and salt of the codegen of each target."""
    rows = set()
    for target in targets:
        codegen = registry.resolve(target)
        compiled = compile_device(codegen, target)
        toolchain = tuple(sorted(codegen.toolchain(target, compiled).items())) \
            if codegen.toolchain is not None else ()
        rows.add((canonical_target(target), codegen.name, compiled, toolchain, codegen.salt))
    return _codegens_json(tuple(sorted(rows)))


@lru_cache(maxsize=1024)
def _codegens_json(rows: tuple) -> str:
    return json.dumps([{"target": t, "codegen": c, "mode": "compiled" if m else "source",
                        "toolchain": dict(tc), "salt": salt} for t, c, m, tc, salt in rows],
                      sort_keys=True, separators=(",", ":"))


_INPUT_PREFIX = _encode_part("input", "0" * 16)[:-16]


# The parts after the input's hash repeat across builds: encoded once per combination.
@lru_cache(maxsize=1024)
def _tail(bind: Target, pipeline_target: Target | None, pipeline: str | None, context: str, codegens: str,
          salts: tuple[tuple[str, str], ...]) -> tuple[tuple[tuple[str, str], ...], bytes]:
    parts = (
        ("target", canonical_target(bind)),
        ("pipeline_target", canonical_target(pipeline_target) if pipeline_target is not None else ""),
        ("pipeline", pipeline if pipeline is not None else "<default for target>"),
        ("pass_context", context),
        *salts,
        ("codegens", codegens),
        ("index_format", INDEX_FORMAT),
    )
    return parts, encode_parts(parts)


def key_of(plan: Plan, registry: DeviceCodegenRegistry) -> CacheKey | None:
    """The build key of a planned build (see codegen_cache._build.build_key); None: not keyable."""
    context = pass_context_part()
    if context is None:
        return None
    if not plan.hashed:
        try:
            plan.hashed.append(input_hash(plan.mod))
        except (TypeError, ValueError) as err:
            warn_once(logger, "build-hash", "codegen_cache.build: cannot hash the input module (%s); "
                      "building without the index", err)
            return None
    # The pipeline's target only picks the pipeline when none is named (beyond that, the host
    # it implies is in the bound target).
    pipeline_target = plan.target if plan.pipeline is None else None
    try:
        codegens = _codegens_part(plan, registry)
    except UncacheableError:
        # A codegen reads an input no key can hold (a callback without an identity): no build
        # key; each lowering then steps aside by itself, counted and warned about once.
        return None
    kinds = frozenset(t.kind.name for t in (plan.bind, plan.host, *plan.func_targets))
    try:
        # The TIR pipeline reads TVM's registered state (lowering rules, global functions its
        # passes call, pipelines by name) as a whole compile does.
        state = tvm_parts(kinds, relax=False)
    except UncacheableError:
        return None  # warned about once where it was found
    return input_key(plan.hashed[0], *_tail(plan.bind, pipeline_target, plan.pipeline, context, codegens,
                                             static_salts() + state))


def input_key(structural: int, tail: tuple[tuple[str, str], ...], tail_bytes: bytes) -> CacheKey:
    """CacheKey.from_parts of ("input", the hash) then `tail`, whose encoding (`tail_bytes`) the caller memoizes.

    A whole build's key (key_of) and a compiled model's (_relax.model_key): the parts after the
    input's hash repeat from compile to compile.
    """
    input_part = ("input", f"{structural & 0xFFFFFFFFFFFFFFFF:016x}")
    digest = xxhash.xxh3_128_hexdigest(_INPUT_PREFIX + input_part[1].encode() + tail_bytes)
    return CacheKey((input_part, *tail), digest)


# ---- the index: the cache's index store, build key -> the digests of the build's parts -------


def write_index(cache: CodegenCache, key: CacheKey, host: BuildPart, devices: Sequence[BuildPart],
                codegen_seconds: float) -> None:
    """Store the index entry of a build; a storage failure is logged once and skipped."""
    meta = {"key": key.digest, "parts": key.as_dict(), "host": host.as_dict(),
            "devices": [p.as_dict() for p in devices], "build_seconds": codegen_seconds, "created": time.time()}
    write_entry(cache, key, frame(INDEX_CODEC, meta, []))


def write_entry(cache: CodegenCache, key: CacheKey, blob: bytes) -> bool:
    """Store a framed index-store entry (staged now, in the store soon); False where that failed (warned)."""
    return cache.stage_index_entry(key.digest, blob)


def read_index(cache: CodegenCache, key: CacheKey) -> tuple[BuildPart, tuple[BuildPart, ...], float] | None:
    """(host part, device parts, their build seconds) of a build key, or None; a bad entry is dropped."""

    def parse(art: Artifact) -> tuple[BuildPart, tuple[BuildPart, ...], float]:
        host = parse_part(art.meta.get("host"))
        devices = art.meta.get("devices")
        if not isinstance(devices, list):
            raise ArtifactError("devices is not a list", kind=INDEX_CODEC)
        return host, tuple(parse_part(d) for d in devices), codegen_seconds_of(art, INDEX_CODEC)

    return read_entry(cache, key, INDEX_CODEC, parse, "build-index")


def codegen_seconds_of(art: Artifact, codec: str) -> float:
    """An entry's codegen_seconds (0 when absent); ArtifactError when it is not a number."""
    seconds = art.meta.get("build_seconds", 0.0)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise ArtifactError("build_seconds is not a number", kind=codec)
    return float(seconds)


def read_entry(cache: CodegenCache, key: CacheKey, codec: str, parse: Callable[[Artifact], T], what: str,
               store_name: str = "index") -> T | None:
    """parse() of the whole-build entry of `key` in `store_name` or staged (codec checked), or None.

    A storage failure is warned about once and is a miss; an entry that is not what `parse` takes
    (ArtifactError) is dropped: a miss either way, and the next cold build writes it again.
    """
    store = cache.store(store_name)
    try:
        blob = store.get(key.digest)
        if blob is None:
            # Staged by a build that returned; its writer may not have moved it yet (or is gone).
            blob = cache.staged("index").read(key.digest)
            if blob is not None:
                cache.promote_index_entry(key.digest, blob)
            else:
                blob = cache.fetch_remote_entry(key.digest)  # another host's (checked there; its codec and key here)
    except INDEX_ERRORS as err:
        if not isinstance(err, CacheLinkError):  # that one was warned about where it was found
            warn_once(logger, (f"{codec}-read", str(cache.directory)), "codegen cache: cannot read the %s "
                      "(%s: %s)", what, type(err).__name__, err)
        return None
    if blob is None:
        return None
    try:
        art = unframe(blob)
        if art.codec != codec or art.meta.get("key") != key.digest:
            raise ArtifactError(f"codec {art.codec!r} with key {str(art.meta.get('key'))[:16]}", kind=codec)
        parsed = parse(art)
        cache.entry_used(store_name, key.digest)  # a whole build's entry is used as its parts are (LRU)
        return parsed
    except ArtifactError as err:
        warn_once(logger, (f"{codec}-corrupt", str(cache.directory)), "codegen cache: dropping a bad %s entry "
                  "%s: %s", what, key.digest[:16], err)
        try:
            store.delete(key.digest)
            cache.staged("index").remove(key.digest, blob)
        except INDEX_ERRORS:
            pass
        return None


def parse_part(value: object, codec: str = INDEX_CODEC) -> BuildPart:
    """A BuildPart from an entry's JSON; ArtifactError naming `codec` when malformed."""
    fields = ("role", "kind", "codegen", "mode", "digest")
    if not isinstance(value, dict) or not all(isinstance(value.get(f), str) for f in fields):
        raise ArtifactError(f"malformed part {str(value)[:80]}", kind=codec)
    if value["mode"] not in ("compiled", "source"):
        raise ArtifactError(f"unknown mode {value['mode']!r}", kind=codec)
    return BuildPart(*(value[f] for f in fields))
