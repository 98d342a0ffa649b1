"""One codec per module kind: what is taken from a built module, and how a hit rebuilds it.

| codec     | fields                                  | a hit returns                                |
| --------- | --------------------------------------- | -------------------------------------------- |
| llvm-ir   | LLVM IR (the raw form; packed, _packed) | an llvm module parsed from it                |
| llvm-so   | shared library, packed LLVM IR          | the library, loaded from a private copy, answering |
|           |                                         | as the built llvm module (_module_methods)   |
| cuda-bin  | fmt, function map, binary, CUDA source  | TVM's CUDA module (needs TVM's CUDA runtime) |
| cuda-module | fmt, function map, data, sources (JSON) | the same CUDA module, sources included (ffi.Module.create.cuda) |
| cuda-fallback | function map, CUDA source          | TVM's source-only CUDA module, made again by target.build.cuda |
|           |                                         | and checked byte for byte (else a source module of the text) |
| c         | C source                                | a C source module with the function names    |
| source    | source text (CUDA, OpenCL, Metal, ...)  | runtime.SourceModuleCreate(text, format)     |

`prepare` runs on the caller's thread and only copies what the module holds, and for llvm
what the built module answers (target string, system-lib flag and
prefix, function names, property mask) and the IR's target triple; `upgrade` turns an llvm-ir
entry into llvm-so in a helper process, for this host's CPU and OS only (LLVM IR for another
target stays IR: no compiler here can link it), and `portable` back (what a host of another
platform can load: the remote tier shares libraries only between hosts of one platform).
Nothing here pickles or unpickles.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _compat
from .._compat import Module
from .._errors import ArtifactError, CudaRuntimeUnavailableError, EntryKeyError
from . import _llvm, _packed
from ._link import ir_triple
from ._frame import CODEC_FIELDS, Artifact, check, frame, unframe

if TYPE_CHECKING:
    from ._cuda import CudaPayload

__all__ = ["CODECS", "check", "decode", "encode_cuda_binary", "function_names", "needs_upgrade", "portable",
           "prepare", "symbol_names", "upgradable"]

# Formats that runtime.SourceModuleCreate is given per fallback module kind.
_SOURCE_FORMATS = {"cuda": "cu", "opencl": "cl", "metal": "metal", "webgpu": "wgsl", "source": ""}


def function_names(mod) -> list[str]:
    """The symbols of an IRModule's functions (global_symbol, else the name), sorted."""
    return symbol_names((gv.name_hint, func) for gv, func in mod.functions.items())


def symbol_names(named: Iterable[tuple[str, Any]]) -> list[str]:
    """function_names of (name, function) pairs (a caller that has them saves a walk of the module)."""
    names = []
    for name, func in named:
        symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
        names.append(str(symbol) if symbol is not None else name)
    return sorted(names)


def prepare(module: Module, meta: Mapping[str, Any], *, func_names: Sequence[str]) -> tuple[str, dict, list[bytes]]:
    """(codec, metadata, fields) of a built module: cheap, and nothing is written anywhere."""
    if not isinstance(module, Module):
        # A codegen's own result, whatever it is, still goes back to its caller: only the entry is skipped.
        raise ValueError(f"cannot cache {type(module).__name__} {module!r:.80}: a codegen returns a tvm.runtime.Module")
    if len(module.imports):
        raise ValueError(f"cannot cache a {module.kind} module with {len(module.imports)} imports")
    kind = module.kind
    meta = {**meta, "module_kind": kind, "func_names": list(func_names)}
    if kind == "llvm":
        ir = _llvm.ir_text(module)
        # What a hit answers as the built module (no JIT: TVM answers these from the IR).
        queries = {}
        for name in _llvm.LLVM_QUERIES:
            try:
                queries[name] = _jsonable(module.get_function(name)())
            except AttributeError:  # a TVM whose llvm module lacks one: the hit asks the parsed IR
                pass
        meta = {**meta, "llvm_queries": queries, "property_mask": int(module.get_property_mask()),
                "triple": ir_triple(ir)}
        return "llvm-ir", meta, [ir]
    if kind == "cuda":
        from . import _cuda  # the CUDA codecs' module: imported by processes that cache CUDA only

        payload = _cuda.module_payload(module)
        if payload.fmt == _cuda.FALLBACK_FMT:
            # TVM's source-only module: its function map too, so that a hit is that module again.
            return "cuda-fallback", {**meta, "source_format": "cu"}, [payload.fmap, payload.code]
        sources = _cuda.module_sources(module)
        if sources and _cuda.can_create_module():
            # A module that carries its source (tilelang's codegens, compiled or not): kept whole,
            # so inspect_source() after a hit is the text the codegen made.
            _cuda.function_infos(payload.fmap)  # a map this codec cannot rebuild is not stored
            fields = [payload.fmt.encode(), payload.fmap, payload.code,
                      json.dumps(sources, sort_keys=True).encode()]
            return "cuda-module", meta, fields
        if _cuda.is_placeholder(payload):
            # Source only, and this TVM cannot rebuild the module: never a binary "ptx".
            return "source", {**meta, "source_format": "cu"}, [module.inspect_source("").encode()]
        source = module.inspect_source("cuda") or _cuda.recall_source(payload.code) or ""
        return "cuda-bin", meta, [payload.fmt.encode(), payload.fmap, payload.code, source.encode()]
    if kind == "c":
        # The C module's function names are not readable; probe the names TVM gives them.
        probes = [p for n in func_names for p in (f"__tvm_ffi_{n}", n)] + ["__tvm_ffi_main"]
        exported = [p for p in probes if module.implements_function(p)]
        return "c", {**meta, "c_func_names": exported}, [module.inspect_source("").encode()]
    fmt = _SOURCE_FORMATS.get(kind, kind)
    return "source", {**meta, "source_format": fmt}, [module.inspect_source("").encode()]


def encode_cuda_binary(payload: CudaPayload, source: str, meta: Mapping[str, Any],
                       *, func_names: Sequence[str]) -> bytes:
    """Frame a compiled CUDA payload without loading it (a GPU-less host filling a cache)."""
    meta = {**meta, "module_kind": "cuda", "func_names": list(func_names)}
    return frame("cuda-bin", meta, [payload.fmt.encode(), payload.fmap, payload.code, source.encode()])


# ---- decoders: (fields, meta, where the value file is, scratch dir) -> module ------------------


# Fields arrive as views of the stored bytes (unframe(views=True)): str(view, "utf-8") decodes
# one without a copy; bytes(view) copies what must outlive or be parsed apart from the blob.


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return [str(v) for v in value]  # get_func_names: an Array of names


def _queries(meta) -> dict:
    found = meta.get("llvm_queries")
    return found if isinstance(found, dict) else {}  # each answer's type is checked when it is asked for


def _llvm_ir(fields, meta, path, scratch) -> Module:
    return _llvm.load_ir(str(_packed.unpack(fields[0]), "utf-8"), scratch, meta.get("func_names", ()), _queries(meta))


def _llvm_so(fields, meta, path, scratch) -> Module:
    if not _llvm.runs_here(meta.get("triple")):
        # Linked on a host of another kind (a shared remote): this one parses its IR instead.
        return _llvm.load_ir(str(_packed.unpack(fields[1]), "utf-8"), scratch, meta.get("func_names", ()), _queries(meta))
    return _llvm.load_library(fields[0], fields[1], path=path, scratch=scratch, func_names=meta.get("func_names", ()),
                              queries=_queries(meta), mask=meta.get("property_mask"))


def _cuda_bin(fields, meta, path, scratch) -> Module:
    from . import _cuda

    fmt, fmap, code, source = (bytes(f) for f in fields)
    if fmt not in (b"fatbin", b"cubin", b"ptx") or not code:
        raise ArtifactError(f"CUDA binary format {fmt[:16]!r} or empty code", kind="cuda-bin")
    # Parse the whole payload before handing it to TVM's loader.
    payload = _cuda.CudaPayload.from_bytes(_cuda.CudaPayload(fmt.decode("ascii"), fmap, code).to_bytes())
    module = _cuda.load_cuda_payload(payload)
    _cuda.remember_source(code, source.decode())
    return module


def _cuda_module(fields, meta, path, scratch) -> Module:
    from . import _cuda

    fmt, fmap, code, sources_json = (bytes(f) for f in fields)  # a hit may hand views of a mapped file
    if fmt not in (b"fatbin", b"cubin", b"ptx") or not code:
        raise ArtifactError(f"CUDA format {fmt[:16]!r} or empty data", kind="cuda-module")
    sources = json.loads(sources_json)
    if not isinstance(sources, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in sources.items()):
        raise ArtifactError("sources is not a map of strings", kind="cuda-module")
    payload = _cuda.CudaPayload(fmt.decode("ascii"), fmap, code)
    if _cuda.can_create_module():
        return _cuda.create_cuda_module(payload, sources)
    if _cuda.is_placeholder(payload):  # source only: the text is all there is
        return _compat.builtin_func("runtime.SourceModuleCreate")(sources.get("cuda", sources.get("cu", "")), "cu")
    raise CudaRuntimeUnavailableError("load a compiled CUDA module")


def _cuda_fallback(fields, meta, path, scratch) -> Module:
    # The code stays a view of the checked entry (a large kernel source is copied once, into
    # the text TVM is handed); fallback_module parses the function map before TVM sees any of it.
    from . import _cuda

    fmap, code = bytes(fields[0]), fields[1]
    module = _cuda.fallback_module(_cuda.CudaPayload(_cuda.FALLBACK_FMT, fmap, code), _entry_target(meta))
    if module is not None:
        return module
    # Where TVM cannot make its module again: a source module with the same text (docs/cache.md).
    return _compat.builtin_func("runtime.SourceModuleCreate")(str(code, "utf-8"), "cu")


def _entry_target(meta) -> dict | None:
    """The target an entry was built for (its key's canonical target), or None."""
    parts = meta.get("parts")
    text = parts.get("target") if isinstance(parts, dict) else None
    try:
        found = json.loads(text) if isinstance(text, str) else None
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def _c_source(fields, meta, path, scratch) -> Module:
    names = [str(n) for n in meta.get("c_func_names", [])]
    return _compat.builtin_func("runtime.CSourceModuleCreate")(str(fields[0], "utf-8"), "c", names, [])


def _source(fields, meta, path, scratch) -> Module:
    return _compat.builtin_func("runtime.SourceModuleCreate")(str(fields[0], "utf-8"),
                                                              str(meta.get("source_format", "")))


Decoder = Callable[[tuple[bytes, ...], dict, "str | None", str], Module]
# codec -> (number of payload fields, decoder)
_DECODERS: dict[str, Decoder] = {
    "llvm-ir": _llvm_ir,
    "llvm-so": _llvm_so,
    "cuda-bin": _cuda_bin,
    "cuda-module": _cuda_module,
    "cuda-fallback": _cuda_fallback,
    "c": _c_source,
    "source": _source,
}
CODECS: dict[str, tuple[int, Decoder]] = {codec: (CODEC_FIELDS[codec], decode) for codec, decode in _DECODERS.items()}


def decode(blob: bytes | memoryview, *, scratch: str, path: str | None = None,
           key: str | None = None, unframed: Artifact | None = None) -> tuple[Module, dict[str, Any]]:
    """Rebuild the runtime module of a framed artifact; ArtifactError when malformed.

    `key`: the digest the entry must be stored under; EntryKeyError when its metadata names
    another, raised before the codec runs (a shared library's constructors run when it loads).
    `path`: the file `blob` was read from (never opened again: what is loaded is `blob`). The
    returned metadata holds what a hit needs (key, codegen_seconds, ...). `unframed`: what
    `unframe(blob, info=False, views=True)` gave for these very bytes (the remote tier checks
    the frame before the signature), so that they are not unframed and checksummed twice.
    """
    art = unframe(blob, info=False, views=True) if unframed is None else unframed
    check(art)
    if key is not None and art.meta.get("key") != key:
        raise EntryKeyError(key, art.meta.get("key"), art.codec)
    try:
        return CODECS[art.codec][1](art.fields, art.meta, path, scratch), art.meta
    except (ArtifactError, CudaRuntimeUnavailableError):
        raise
    except (struct.error, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"payload is malformed ({err})", kind=art.codec) from None
    except (RuntimeError, ValueError) as err:  # what TVM's loaders raise on bad bytes
        first = str(err).strip().splitlines()[-1:] or [""]
        raise ArtifactError(f"TVM could not load the payload ({first[0][:200]})", kind=art.codec) from None


def upgradable(codec: str, meta: Mapping[str, Any]) -> bool:
    """Whether an entry has a faster form this host can make: LLVM IR for this host's kind of CPU and OS.

    LLVM IR for another target (aarch64, ARM, RISC-V on an x86 host) stays IR: a hit parses it
    into a real llvm module that exports with a cross toolchain; no compiler links it here.
    """
    return codec == "llvm-ir" and _llvm.runs_here(meta.get("triple"))


def needs_upgrade(module: Module, meta: Mapping[str, Any]) -> bool:
    """Whether a hit was served from LLVM IR that this host can link into a shared library."""
    if not isinstance(module, _llvm.CachedIRModule):
        return False
    return _llvm.runs_here(meta.get("triple") or ir_triple(module._cgc_record.ir_text()))


def portable(blob: bytes | memoryview) -> bytes:
    """The entry in a form every host can load: an llvm-so entry as the llvm-ir entry it was upgraded from.

    The metadata is the upgrade's input, kept whole, and the IR its input's text, packed
    smaller (_packed.py); other entries are returned as they are.
    """
    art = unframe(blob)
    if art.codec != "llvm-so":
        return bytes(blob)
    check(art)
    return frame("llvm-ir", art.meta, [art.fields[1]])
