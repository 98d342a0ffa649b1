"""tvm.relax.build through the cache: a Relax model compiled before comes back without any pipeline.

While codegen_cache.enable() is on, `tvm.relax.build` (and so `tvm.compile` of a Relax module)
comes here. The *model key* is computed from what relax.build is given, before anything runs:

    input          structural hash of the IRModule (map_free_vars=True); TVM's hash covers the
                   bytes of every bound constant (relax.const, bound weights), so two models
                   that differ in one weight never share a key. A model with 1 MiB of Relax
                   constants or more is hashed with tensor bytes left out here, and:
    weights        xxh3-128 of its constants' dtypes, shapes and bytes (_weights.py; else empty)
    params         the names and structural hashes of the tensors passed as `params`
    target         the target given, canonical, host included; Target.current() when none is
    relax_pipeline, tir_pipeline, exec_mode, system_lib
    pass_context   opt level, config, required and disabled passes (as codegen_cache.build)
    tvm_install    a digest of the installed tvm and tvm_ffi (their sources and libraries, _install.py)
    registered     TVM's registered state as its difference from a clean import of that TVM:
                   global functions, op attributes, pipelines by name, module attributes (_reads.py)
    database       the records of the MetaSchedule database in context
    codegen_cache  the package version (its own functions registered into TVM: the switch's routers)
    tvm, tvm_ffi, llvm    the static salts
    codegens       name, mode, toolchain and salt of each codegen the build may call
    model_format

An entry (codec "relax-executable", in the cache's compiled store, where its library's entries
are: a warm compile reads them through their key files, or from one store's rows) holds the
VMExecutable's own bytes (VM bytecode, constants, bound params: what its write_to_file writes,
without imports) less its tensors' byte runs, which are entries of their own, by content
(_tensors.py: shared by every model holding them), and names the parts of the build that made
its library (device-level entries by digest). A hit joins those bytes back, loads the
executable from them, serves the library from its parts and imports it: no Relax pipeline, no
TIR pipeline, no codegen. A model is served whole or not at all: a part absent or damaged
makes it a miss. A re-run in one process is a memory hit, exact (the input is compared with
the one compiled, structural_equal; with weights keyed apart, the structure, the weights
being equal by digest).

With verify=True the entry also holds an exact digest of the input (the module's JSON, the
params' bytes), and a disk hit is served only where the compile's input has that digest.

Not keyable, so relax.build runs as TVM's own (its codegen calls still go through the cache): a
pipeline given as a Pass or callable, a PassContext with instruments, params that are not
tensors, a codegen that reads an input no key can hold, a registration no identity stands for
(warned once per registration, with the way to declare a salt). Not stored: an executable that
imports other modules than the library its one build made (external BYOC modules).

Counted as one call in the row "relax.build/model" (_cache/_stats.py): a hit saving the whole
compile it replaced (the miss's seconds in TVM's relax.build), or a miss, whose TIR build and
codegen lowerings count only their work (codegen runs, stores). A compile the model key cannot
hold is not counted here: its TIR build counts as a call of its own.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import xxhash

from .. import _artifacts, _compat
from .._artifacts import Artifact, frame
from .._cache import CodegenCache
from .._cache._stats import counted_as_one
from .._cache._tiers import ir_digest
from .._cache._writer import writer
from .._compat import IRModule, Module, Target, tvm
from .._errors import ArtifactError, UncacheableError
from .._key import CacheKey, _encode_part, encode_parts, static_salts
from .._log import warn_once
from .._outcome import emit
from .._registry import DeviceCodegenRegistry
from .._storage._layout import MODEL_CODEC
from .._targets import canonical_target
from .._version import __version__
from ._build import BuildRecord, capture_builds, serve_parts
from ._identity import DECLARE_HINT
from ._index import (codegen_seconds_of, codegens_json, input_key, pass_context_part, parse_part, read_entry,
                     write_entry)
from ._plan import tirx_host
from ._reads import database_part, tvm_parts
from . import _lineage, _tensors
from ._weights import Weights, model_weights, unchanged

__all__ = ["MODEL_CODEC", "MODEL_FORMAT", "model_key", "relax_build"]

logger = logging.getLogger(__name__)

# Bump when the entry's layout or the model key's parts change.
MODEL_FORMAT = "3"
_MEMO_PREFIX = "relax:"
# The row a Relax compile's one count goes to (Outcome.codegen and .mode of a compile).
_ROW = ("relax.build", "model")
_PIPELINE_TYPES = (str, type(None))
# A model with this many bytes of bound weights or more is serialized and stored by the writer
# thread after the compile returns; below it, staged before (it survives the process).
BACKGROUND_BYTES = 4 << 20


def model_key(mod: IRModule, target: Target | None, params: Mapping[str, Any] | None, relax_pipeline: Any,
              tir_pipeline: Any, exec_mode: str, system_lib: bool | None,
              registry: DeviceCodegenRegistry) -> CacheKey | None:
    """The model key of a relax.build call, or None when it cannot be keyed (see the module docstring)."""
    found = _model_key(mod, target, params, relax_pipeline, tir_pipeline, exec_mode, system_lib, registry)
    return None if found is None else found[0]


def _model_key(mod: IRModule, target: Target | None, params: Mapping[str, Any] | None, relax_pipeline: Any,
               tir_pipeline: Any, exec_mode: str, system_lib: bool | None,
               registry: DeviceCodegenRegistry) -> tuple[CacheKey, Weights | None] | None:
    """(model key, its weights when keyed apart), or None when it cannot be keyed."""
    if not isinstance(relax_pipeline, _PIPELINE_TYPES) or not isinstance(tir_pipeline, _PIPELINE_TYPES):
        return None
    if not isinstance(exec_mode, str) or not isinstance(system_lib, (bool, type(None))):
        return None
    context = pass_context_part()
    if context is None:
        return None
    params_part = _params_part(params)
    if params_part is None:
        return None
    scope = target if target is not None else Target.current()
    try:
        targets = _targets_read(scope, _vdevice_targets(mod))
        codegens = codegens_json(targets, registry)
        tvm_state = tvm_parts(frozenset(t.kind.name for t in targets))
        database = database_part()
        weights = model_weights(mod)
        structural = weights.structure if weights is not None else _compat.structural_hash(mod)
    except UncacheableError as err:
        if err.remedy.startswith(DECLARE_HINT):
            warn_once(logger, ("model-unidentified", err.what), "codegen cache: %s; compiling this model without "
                      "the model-level cache (its codegen calls still go through the cache)", err)
        return None
    except (TypeError, ValueError) as err:
        warn_once(logger, "model-hash", "codegen cache: cannot key a relax.build input (%s); compiling it "
                  "without the model-level cache", err)
        return None
    tail = (
        ("params", params_part),
        ("target", canonical_target(scope) if scope is not None else ""),
        ("relax_pipeline", "<none>" if relax_pipeline is None else relax_pipeline),
        ("tir_pipeline", "<default for target>" if tir_pipeline is None else tir_pipeline),
        ("exec_mode", exec_mode),
        ("system_lib", "auto" if system_lib is None else str(system_lib)),
        ("pass_context", context),
        *tvm_state,
        ("database", database),
        ("codegen_cache", __version__),
        *static_salts(),
        ("codegens", codegens),
        ("model_format", MODEL_FORMAT),
    )
    weights_part = ("weights", weights.digest if weights is not None else "")
    return input_key(structural, (weights_part, *tail), _encode_part(*weights_part) + _encoded(tail)), weights


_encoded = lru_cache(maxsize=256)(encode_parts)  # the tail's bytes, once per combination of its parts


def _params_part(params: Mapping[str, Any] | None) -> str | None:
    if not params:
        return ""
    if not isinstance(params, Mapping):
        return None
    digest = xxhash.xxh3_128()
    for name in sorted(params, key=str):
        values = params[name]
        values = values if isinstance(values, (list, tuple)) else [values]
        digest.update(_encode_part(str(name), str(len(values))))
        for value in values:
            if _compat.Tensor is None or not isinstance(value, _compat.Tensor):
                return None  # a numpy array or another object: TVM converts it; no key here
            digest.update(_encode_part("tensor", f"{_compat.structural_hash(value) & 0xFFFFFFFFFFFFFFFF:016x}"))
    return digest.hexdigest()


def _targets_read(target: Target | None, vdevices: list[Target]) -> list[Target]:
    """The targets this compile may build for: the target, the module's vdevices, their hosts,
    and the host tvm.tirx.build takes for the target (TVM's default host where the module has
    vdevices: a build for one may take it)."""
    targets = list(vdevices)
    if target is not None:
        targets.append(target)
    for found in list(targets):
        if found.host is not None:
            targets.append(found.host)
    targets.append(tirx_host(None if vdevices else target))
    return targets


def _vdevice_targets(mod: IRModule) -> list[Target]:
    """The targets of the module's virtual devices (a multi-target Relax module names them there)."""
    infos = mod.global_infos.get("vdevice", None) if mod.global_infos is not None else None
    return [v.target for v in infos or () if isinstance(getattr(v, "target", None), Target)]


# ---- the call -------------------------------------------------------------------------------


def relax_build(original: Callable[..., Any], cache: CodegenCache, mod: Any, target: Any = None,
                params: Any = None, relax_pipeline: Any = "default", tir_pipeline: Any = "default",
                exec_mode: str = "bytecode", *, system_lib: bool | None = None) -> Any:
    """tvm.relax.build(mod, ...) through `cache`; `original` is TVM's relax.build (called on a miss)."""
    start = time.perf_counter()
    call = dict(params=params, relax_pipeline=relax_pipeline, tir_pipeline=tir_pipeline, exec_mode=exec_mode,
                system_lib=system_lib)
    found = None
    if isinstance(mod, IRModule):
        as_target = Target(target) if isinstance(target, str) else target
        if as_target is None or isinstance(as_target, Target):
            found = _model_key(mod, as_target, params, relax_pipeline, tir_pipeline, exec_mode, system_lib,
                               cache.registry)
    if found is None:
        return original(mod, target, **call)
    key, weights = found
    key_seconds = time.perf_counter() - start
    served = _warm(cache, key, weights, mod, params, key_seconds, start)
    if served is not None:
        return served
    snapshot = mod.clone() if hasattr(mod, "clone") else mod  # the pipeline may not change the caller's module
    # The background writer waits until the compile returns: its SQLite work and the llvm
    # upgrader it starts would take the cores the pipeline runs on (every entry is staged first).
    cache.counters.add_call(*_ROW, "misses")
    with writer.hold():
        compile_start = time.perf_counter()
        with capture_builds() as builds, counted_as_one():
            executable = original(mod, target, **call)
        # What a hit of this model will save: the whole compile; of its codegen time, this
        # compile ran only the builds that were not served.
        compile_seconds = time.perf_counter() - compile_start
        ran = sum(record.codegen_seconds for record, _module in builds if record.tier in ("codegen", "uncached"))
        stored = _store(cache, key, weights, executable, builds, snapshot, params, compile_seconds)
    total = time.perf_counter() - start
    emit(tier="codegen", key=key.digest, codegen="relax.build", mode="model", key_seconds=key_seconds, load_seconds=0.0,
         codegen_seconds=ran, total_seconds=total, stored=stored)
    return executable


def _warm(cache: CodegenCache, key: CacheKey, weights: Weights | None, mod: IRModule, params: Any,
          key_seconds: float, start: float) -> Any:
    # With weights keyed apart, the key holds their content digest: the memory hit compares the
    # structure alone (not the tensors' bytes again), the weights being equal by digest.
    memo = cache.fetch_kept(_MEMO_PREFIX + key.digest, ir=mod if weights is None else None, count=False)
    module, kept = _kept(memo[1]) if memo is not None else (None, None)
    if module is not None and weights is not None:
        if not _compat.structure_equal(memo[1]["ir"], mod) or (kept is not None and not unchanged(kept, weights)):
            module = None  # another structure, or tensors written in place since: the disk entry, or a compile
    if module is not None:
        _served(cache, "memory", key, key_seconds, start, memo[1]["saves"])
        return tvm.relax.VMExecutable(module)
    entry = _read(cache, key)
    if entry is None:
        return None
    skeleton, chunks, record, stored_input, saves = entry
    verify = cache.settings.verify
    if verify and stored_input != _input_digest(mod, params):
        return None  # stored without verify, or another input under the same 64-bit hash: compile
    library = serve_parts(cache, record.host, record.devices, named_exactly=verify) if record is not None else None
    if record is not None and library is None:
        return None  # a part was evicted: compile again (and store it anew)
    data = skeleton
    if chunks:
        pieces = _tensors.read_chunks(cache, chunks, check_digest=verify)
        if pieces is None:
            return None  # a weights chunk was evicted or is damaged: compile again (and store it anew)
        try:
            data = _tensors.join(skeleton, chunks, pieces)
        except ArtifactError:
            return None
    executable = _executable(data, library)
    _remember(cache, key, mod.clone(), executable, record, saves, len(data), None)
    _served(cache, "disk", key, key_seconds, start, saves)
    return executable


def _executable(data: bytes, library: Module | None) -> Any:
    """A VMExecutable from its own bytes, importing `library` as relax.build's VMLink does.

    Where `library` is a cached library that answers as built, the executable's module is the
    as-built root already (the module is ours alone): the switch's as_built_root has nothing to walk.
    """
    module = _compat.builtin_func("ffi.Module.load_from_bytes.relax.VMExecutable")(data)
    if library is not None:
        module.import_module(library)
        if _artifacts.library_record(library) is not None:
            module = _artifacts.own_root(module)
    return tvm.relax.VMExecutable(module)


def _served(cache: CodegenCache, tier: str, key: CacheKey, key_seconds: float, start: float, saved: float) -> None:
    """A model served whole: one hit of `tier` saving the whole compile it replaced, counted as its outcome says."""
    cache.counters.add_hit(*_ROW, tier, saved)
    total = time.perf_counter() - start
    emit(tier=tier, key=key.digest, codegen="relax.build", mode="model", key_seconds=key_seconds,
         load_seconds=total - key_seconds, codegen_seconds=saved, total_seconds=total)


# ---- entries ----------------------------------------------------------------------------------


def _store(cache: CodegenCache, key: CacheKey, weights: Weights | None, executable: Any,
           builds: list[tuple[BuildRecord, Module]], snapshot: IRModule, params: Any, compile_seconds: float) -> bool:
    """Store the model entry of a fresh executable, where its library is what one stored build made.

    Its weights go to entries of their own (_tensors.py). A model with BACKGROUND_BYTES of
    weights or more is serialized and stored by the writer thread after the compile returned
    (a process killed before that stores nothing: its next compile is a miss); a smaller one,
    or any with write_behind=False, is staged before the compile returns.
    """
    module = getattr(executable, "mod", None)
    if not isinstance(module, Module) or module.kind != "relax.VMExecutable":
        return False
    imports = module.imports
    record = None
    if builds or len(imports):
        if len(builds) != 1 or len(imports) != 1:
            return False  # external modules beside the library, or a build this entry cannot name
        record, library = builds[0]
        if imports[0].__chandle__() != library.__chandle__() or len(library.imports) != len(record.devices):
            return False  # relax.build imported modules of its own into the library
        if record.key is None or not all(p.digest is not None for p in (record.host, *record.devices)):
            return False  # a part was not stored
        seconds = sum(r.codegen_seconds for r, _module in builds)
        record = BuildRecord("codegen", record.key, record.host, record.devices, seconds)
    meta = {"key": key.digest, "codegen": "relax.build", "parts": key.as_dict(),
            "build_seconds": record.codegen_seconds if record else 0.0,
            "compile_seconds": compile_seconds, "created": time.time(),
            "library": None if record is None else {"build_key": record.key.digest,
                                                    "host": record.host.as_dict(),
                                                    "devices": [p.as_dict() for p in record.devices]}}
    if weights is not None:
        meta["tensors"] = list(weights.tensors)
    if cache.settings.verify:
        meta["input_digest"] = _input_digest(snapshot, params)
    _remember(cache, key, snapshot, executable, record, compile_seconds, weights.nbytes if weights is not None else 0,
              weights)
    family = _lineage.family_of(snapshot)
    if cache.write_behind and weights is not None and weights.nbytes >= BACKGROUND_BYTES:
        writer.submit(lambda: _write(cache, key, module, meta, family, staged=False))
        return True
    return _write(cache, key, module, meta, family, staged=True)


def _write(cache: CodegenCache, key: CacheKey, module: Module, meta: dict[str, Any], family: str, *,
           staged: bool) -> bool:
    """Serialize the executable, store its weights' chunks, then the model's entry naming them, then its lineage record."""
    data = _executable_bytes(module, cache)
    if data is None:
        return False
    skeleton, chunks, pieces = _tensors.split(data)
    if not _tensors.store_chunks(cache, chunks, pieces, staged=staged):
        return False  # a model entry is written only once every chunk it names is
    meta["weights"] = _tensors.as_meta(chunks)
    if not write_entry(cache, key, frame(MODEL_CODEC, meta, [skeleton])):
        return False
    def record() -> None:
        _lineage.add_record(cache, family, key.digest, key.as_dict(), meta.get("tensors"))

    if cache.write_behind and staged:
        writer.submit(record)  # not on the caller's path: it opens the index store
    else:
        record()
    return True


def _executable_bytes(module: Module, cache: CodegenCache) -> bytes | None:
    """The VMExecutable's own serialization (its write_to_file; imports are not included)."""
    fd, path = tempfile.mkstemp(prefix="cgc-", suffix=".vmexec", dir=cache.scratch_dir())
    os.close(fd)
    try:
        module.write_to_file(path)
        with open(path, "rb") as f:
            return f.read()
    except (OSError, RuntimeError) as err:
        warn_once(logger, "model-serialize", "codegen cache: cannot serialize a VMExecutable (%s); not storing "
                  "compiled models", err)
        return None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def _input_digest(mod: IRModule, params: Any) -> str:
    """What identifies a relax.build input exactly (verify=True): the module's JSON and the params' bytes."""
    digest = xxhash.xxh3_128(ir_digest(mod).encode())
    for name in sorted(params or (), key=str):
        values = params[name] if isinstance(params[name], (list, tuple)) else [params[name]]
        for value in values:  # tensors: model_key keys no other params
            array = value.numpy()
            digest.update(_encode_part(str(name), f"{array.dtype}{array.shape}"))
            digest.update(array.tobytes())
    return digest.hexdigest()


_Entry = tuple[bytes, tuple[_tensors.Chunk, ...], BuildRecord | None, str | None, float]


def _read(cache: CodegenCache, key: CacheKey) -> _Entry | None:
    return read_entry(cache, key, MODEL_CODEC, _parse_entry, "compiled model", "compiled")


def _parse_entry(art: Artifact) -> _Entry:
    """(skeleton, weights chunks, library record, input digest, seconds a hit saves) of a model entry."""
    if len(art.fields) != 1:
        raise ArtifactError(f"{len(art.fields)} fields, expected 1", kind=MODEL_CODEC)
    seconds = codegen_seconds_of(art, MODEL_CODEC)
    saves = art.meta.get("compile_seconds", seconds)
    if not isinstance(saves, (int, float)) or isinstance(saves, bool):
        raise ArtifactError("compile_seconds is not a number", kind=MODEL_CODEC)
    stored_input = art.meta.get("input_digest")
    if stored_input is not None and not isinstance(stored_input, str):
        raise ArtifactError("input_digest is not a string", kind=MODEL_CODEC)
    chunks = _tensors.parse_chunks(art.meta.get("weights", []))
    library = art.meta.get("library")
    if library is None:
        return bytes(art.fields[0]), chunks, None, stored_input, float(saves)
    if not isinstance(library, dict) or not isinstance(library.get("devices"), list) \
            or not isinstance(library.get("build_key"), str):
        raise ArtifactError("malformed library", kind=MODEL_CODEC)
    host = parse_part(library.get("host"), MODEL_CODEC)
    devices = tuple(parse_part(d, MODEL_CODEC) for d in library["devices"])
    build_key = CacheKey((("build", library["build_key"]),), library["build_key"])
    record = BuildRecord("disk", build_key, host, devices, seconds)
    return bytes(art.fields[0]), chunks, record, stored_input, float(saves)


def _remember(cache: CodegenCache, key: CacheKey, mod: IRModule, executable: Any, record: BuildRecord | None,
              saves: float, nbytes: int, weights: Weights | None) -> None:
    # In-process only: the meta holds the executable's module (each hit wraps it anew; nothing
    # changes a VMExecutable once built) and the input it was compiled from, never serialized.
    # `weights`: the tensors a fresh executable holds (TVM does not copy bound constants), checked
    # before it is served again; None where it holds its own copies (loaded from bytes).
    # A model whose constants (`nbytes`, where known) would take over a quarter of the memory
    # tier is held weakly, through the executable the caller got: a re-run while the caller
    # still holds it is a memory hit, and the tier never keeps those bytes alive by itself.
    module = executable.mod
    library = module.imports[0] if len(module.imports) else None
    weak = nbytes + (1 << 16) > cache.settings.memory_bytes // 4
    # Weakly: a one-item WeakKeyDictionary, so that the tensors `weights` names are held only
    # while the executable (which holds them too) lives.
    held = weakref.WeakKeyDictionary({executable: weights}) if weak else (module, weights)
    cache.keep(_MEMO_PREFIX + key.digest, library, mod, {"key": key.digest, "executable": held, "ir": mod,
                                                         "record": record, "saves": saves},
               nbytes=(1 << 16) + (0 if weak else nbytes))


def _kept(meta: dict[str, Any]) -> tuple[Module | None, Weights | None]:
    """(the executable module _remember kept, the tensors it holds), or (None, None) where it was held weakly and is gone."""
    held = meta["executable"]
    if isinstance(held, weakref.WeakKeyDictionary):
        for executable, weights in list(held.items()):
            return executable.mod, weights
        return None, None
    return held
