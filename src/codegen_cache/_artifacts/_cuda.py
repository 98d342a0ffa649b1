"""TVM's CUDA module byte format, parsed and written without TVM, and loaded through TVM.

A compiled CUDA module saves as [fmt][function map][code] (each length-prefixed); TVM's
`ffi.Module.load_from_bytes.cuda` reads it back where TVM's CUDA runtime is loaded (a GPU
driver). The format lives here, beside the other codecs, so that any CUDA codegen (ours or a
user's) produces entries every reader can decode.

A source-only module (TVM's fallback module: kind `cuda`, format "cuda", the CUDA source as its
data) is what `target.build.cuda` returns without TVM's CUDA runtime, or with it under
TVM_COMPILE_FORCE_FALLBACK. TVM gives Python no constructor for it, so `fallback_module` has
target.build.cuda make one again (see there); a hit is then the module TVM built, and exports
as it does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

import xxhash

from .. import _compat
from .._compat import IRModule, Module, Target
from .._errors import ArtifactError, CudaRuntimeUnavailableError
from .._forksafe import renew_after_fork
from .._registry import call_codegen_function, codegen_function

__all__ = [
    "FALLBACK_FMT",
    "SOURCE_KEYS",
    "CudaPayload",
    "can_create_module",
    "create_cuda_module",
    "fallback_module",
    "forced_fallback",
    "function_infos",
    "is_placeholder",
    "load_cuda_payload",
    "module_payload",
    "module_sources",
    "recall_source",
    "remember_source",
    "saves_as",
]

_U64 = struct.Struct("<Q")
# Compiled modules loaded from bytes do not keep their CUDA source; remember it for the cache.
_SOURCES_MAX = 256
_sources: OrderedDict[bytes, str] = OrderedDict()
_sources_lock = threading.Lock()
renew_after_fork(globals(), "_sources_lock")


class CudaPayload(NamedTuple):
    """TVM's CUDA module save format: [fmt][function map][code], each length-prefixed.

    A NamedTuple (immutable, compared by its fields), not a frozen dataclass: the class is made
    in every process that reads or writes a CUDA entry, and a dataclass is several times as dear
    to make (docs/benchmarks.md at 5788f7c, "Records made at import").
    """

    fmt: str
    fmap: bytes
    code: bytes | memoryview  # a hit's code may be a view of the checked entry

    def to_bytes(self) -> bytes:
        """Serialize in TVM's byte format (what `ffi.Module.load_from_bytes.cuda` reads)."""
        return b"".join(self.pieces())

    def pieces(self) -> tuple[bytes | memoryview, ...]:
        """TVM's byte format in pieces, whose concatenation is `to_bytes()` (the code not copied)."""
        fmt = self.fmt.encode()
        return _U64.pack(len(fmt)), fmt, self.fmap, _U64.pack(len(self.code)), self.code

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> CudaPayload:
        """Parse TVM's byte format (fields copied out of a view); raise ArtifactError on anything malformed."""
        try:
            fmt, pos = _read_str(data, 0)
            fmap_start = pos
            pos = _skip_fmap(data, pos)
            fmap_end = pos
            code, pos = _read_str(data, pos)
        except (struct.error, UnicodeDecodeError, ValueError) as err:
            raise ArtifactError(f"CUDA payload is malformed ({err})", kind="cuda") from None
        if pos != len(data):
            raise ArtifactError(f"CUDA payload has {len(data) - pos} trailing bytes", kind="cuda")
        return cls(str(fmt, "ascii"), bytes(data[fmap_start:fmap_end]), bytes(code))


def _read_str(data: bytes, pos: int) -> tuple[bytes, int]:
    (length,) = _U64.unpack_from(data, pos)
    end = pos + 8 + length
    if end > len(data):
        raise ValueError(f"a field of {length} bytes runs past the end ({len(data)} bytes)")
    return data[pos + 8 : end], end


def _skip_fmap(data: bytes, pos: int) -> int:
    # Map<String, FunctionInfo>: count, then per entry the key and FunctionInfo::Save's fields:
    # name, arg_types (4-byte DLDataType each), launch_param_tags (strings), arg_extra_tags (u32).
    (count,) = _U64.unpack_from(data, pos)
    pos += 8
    for _ in range(count):
        _key, pos = _read_str(data, pos)
        _name, pos = _read_str(data, pos)
        (n_args,) = _U64.unpack_from(data, pos)
        pos += 8 + 4 * n_args
        (n_tags,) = _U64.unpack_from(data, pos)
        pos += 8
        for _ in range(n_tags):
            _tag, pos = _read_str(data, pos)
        (n_extra,) = _U64.unpack_from(data, pos)
        pos += 8 + 4 * n_extra
        if pos > len(data):
            raise ValueError("function map runs past the end")
    return pos


def module_payload(module: Module) -> CudaPayload:
    """The save-to-bytes payload of a CUDA runtime module (no imports), parsed."""
    packed, start, size = _saved(module)
    return CudaPayload.from_bytes(packed[start : start + size])


def saves_as(module: Module, payload: CudaPayload) -> bool:
    """Whether `module` (a CUDA runtime module, no imports) saves to exactly `payload`.

    Compared where TVM wrote it, by xxh3-128 digest, piece by piece on the payload's side: neither
    side's code is copied (in a fresh process a large copy is new pages, as costly as the
    comparison: docs/benchmarks.md at 5788f7c, "A warm CUDA model's copies").
    """
    pieces = payload.pieces()
    packed, start, size = _saved(module)
    if size != sum(len(piece) for piece in pieces):
        return False
    expected = xxhash.xxh3_128()
    for piece in pieces:
        expected.update(piece)
    return xxhash.xxh3_128_digest(packed[start : start + size]) == expected.digest()


def _saved(module: Module) -> tuple[memoryview, int, int]:
    """(TVM's save of `module` as bytes, read in place, where its payload starts, its length).

    The saved tensor is viewed through DLPack, not copied; ArtifactError for a module that is
    not one CUDA module.
    """
    import numpy  # TVM's runtime imported it already

    tensor = _compat.global_func("runtime.ModulePackImportsToTensor")(module)
    packed = memoryview(numpy.from_dlpack(tensor)).cast("B")
    # Container: [u64 size][u64 n][n x u64 row_ptr][u64 m][m x u64 child][str kind][bytes payload]
    pos = 8
    (rows,) = _U64.unpack_from(packed, pos)
    pos += 8 + 8 * rows
    (children,) = _U64.unpack_from(packed, pos)
    pos += 8 + 8 * children
    (kind_len,) = _U64.unpack_from(packed, pos)
    kind = bytes(packed[pos + 8 : pos + 8 + kind_len])
    pos += 8 + kind_len
    if kind != b"cuda":
        raise ArtifactError(f"expected a cuda module, found {kind!r}", kind="cuda")
    (size,) = _U64.unpack_from(packed, pos)
    if pos + 8 + size > len(packed):
        raise ArtifactError(f"the saved module's payload of {size} bytes runs past its end", kind="cuda")
    return packed, pos + 8, size


def remember_source(code: bytes, source: str) -> None:
    """Keep the CUDA source of a compiled binary, which TVM's loaded module does not hold."""
    with _sources_lock:
        _sources[code] = source
        _sources.move_to_end(code)
        while len(_sources) > _SOURCES_MAX:
            _sources.popitem(last=False)


def recall_source(code: bytes) -> str | None:
    """The CUDA source remembered for a compiled binary, if any."""
    with _sources_lock:
        return _sources.get(code)


def load_cuda_payload(payload: CudaPayload) -> Module:
    """Load a compiled payload through TVM's CUDA runtime; a clear error where it is missing."""
    loader = _compat.global_func("ffi.Module.load_from_bytes.cuda", missing_ok=True)
    if loader is None:
        raise CudaRuntimeUnavailableError("load a compiled CUDA module")
    return loader(payload.to_bytes())


# ---- a CUDA module with its sources (ffi.Module.create.cuda) ----------------------------------

# The formats a CUDA module answers inspect_source() with from its sources map.
SOURCE_KEYS = ("cuda", "cu")


def is_placeholder(payload: CudaPayload) -> bool:
    """True for a source-only CUDA module (tilelang's TVM): format and data are the text "ptx"."""
    return payload.fmt == "ptx" and payload.code == b"ptx"


def can_create_module() -> bool:
    """Whether this TVM can build a CUDA module from data, function map and sources."""
    return (_compat.global_func("ffi.Module.create.cuda", missing_ok=True) is not None
            and _compat.global_func("runtime.LoadMetaDataFromJSON", missing_ok=True) is not None)


def module_sources(module: Module) -> dict[str, str]:
    """The module's sources map as inspect_source reads it (the formats of SOURCE_KEYS)."""
    found = {}
    for key in SOURCE_KEYS:
        text = module.inspect_source(key)
        if text:
            found[key] = text
    return found


@functools.lru_cache(maxsize=256)
def _dtype_name(code_bits_lanes: tuple[int, int, int]) -> str:
    return str(_compat.tvm_ffi.dtype.from_dlpack_data_type(code_bits_lanes))


def function_infos(fmap: bytes) -> dict[str, dict]:
    """The function map of TVM's CUDA format as TVM's JSON metadata ("func_info")."""
    infos = {}
    try:
        (count,) = _U64.unpack_from(fmap, 0)
        pos = 8
        for _ in range(count):
            key, pos = _read_str(fmap, pos)
            name, pos = _read_str(fmap, pos)
            (n_args,) = _U64.unpack_from(fmap, pos)
            pos += 8
            types = []
            for _ in range(n_args):
                types.append(_dtype_name(struct.unpack_from("<BBH", fmap, pos)))
                pos += 4
            (n_tags,) = _U64.unpack_from(fmap, pos)
            pos += 8
            tags = []
            for _ in range(n_tags):
                tag, pos = _read_str(fmap, pos)
                tags.append(tag.decode())
            (n_extra,) = _U64.unpack_from(fmap, pos)
            extra = list(struct.unpack_from(f"<{n_extra}I", fmap, pos + 8))
            pos += 8 + 4 * n_extra
            infos[key.decode()] = {"name": name.decode(), "arg_types": types, "launch_param_tags": tags,
                                   "arg_extra_tags": extra}
    except (struct.error, UnicodeDecodeError, ValueError) as err:
        raise ArtifactError(f"CUDA function map is malformed ({err})", kind="cuda-module") from None
    if pos != len(fmap):
        raise ArtifactError(f"CUDA function map has {len(fmap) - pos} trailing bytes", kind="cuda-module")
    return infos


def create_cuda_module(payload: CudaPayload, sources: dict[str, str]) -> Module:
    """The CUDA module TVM's codegen made: same data, format, function map and sources.

    Creating it loads nothing on a device (a compiled one is loaded on first launch), so it
    works without a GPU wherever TVM's CUDA runtime is built in (tilelang's TVM).
    """
    meta = json.dumps({"tvm_version": _compat.tvm.__version__, "func_info": function_infos(payload.fmap)})
    fmap = _compat.builtin_func("runtime.LoadMetaDataFromJSON")(meta)
    return _compat.builtin_func("ffi.Module.create.cuda")(payload.code, payload.fmt, fmap, sources)


# ---- TVM's source-only CUDA module (its fallback module), made again -------------------------

FALLBACK_FMT = "cuda"  # the format of TVM's source-only CUDA module: its data is the CUDA source
_TENSOR_MAP = 1  # runtime::ArgExtraTags::kTensorMap
_POSTPROC = "tvm_callback_cuda_postproc"
# TVM_COMPILE_FORCE_FALLBACK and the postproc hook are process-wide: one thread at a time.
_fallback_lock = threading.RLock()
renew_after_fork(globals(), "_fallback_lock", threading.RLock)
_DEFAULT_TARGET = {"kind": "cuda", "arch": "sm_90"}
# fallback_module checks a twin with this text where the text is longer than _TWIN_ABOVE bytes
# per kernel: the crossover of a save's copy of the text against one more codegen of empty
# kernels (docs/benchmarks.md at 5788f7c, "A warm CUDA model's check on a twin").
_MARKER = "// codegen-cache: this module checks the function map and format of its twin\n"
_MARKER_BYTES = _MARKER.encode()
_TWIN_ABOVE = 16 * 1024


@contextlib.contextmanager
def forced_fallback() -> Iterator[None]:
    """Inside the block, target.build.cuda returns its source-only module, also where TVM's CUDA runtime is loaded."""
    with _fallback_lock:
        if not _compat.cuda_runtime_available():
            yield  # the fallback is all this TVM makes
            return
        previous = os.environ.get("TVM_COMPILE_FORCE_FALLBACK")
        os.environ["TVM_COMPILE_FORCE_FALLBACK"] = "1"
        try:
            yield
        finally:
            if previous is None:
                del os.environ["TVM_COMPILE_FORCE_FALLBACK"]
            else:
                os.environ["TVM_COMPILE_FORCE_FALLBACK"] = previous


def fallback_module(payload: CudaPayload, target: object = None) -> Module | None:
    """TVM's own source-only CUDA module that saves to `payload` exactly, or None where none can be made.

    Only target.build.cuda makes one. It is given a module of empty kernels with the payload's
    function map (names, argument types, tensor-map arguments, launch parameters: all that
    TVM's ExtractFuncInfo reads), and `tvm_callback_cuda_postproc` answers the text of this
    thread's call (for any other thread's, what was registered before, or the source
    unchanged); the hook is put back after the calls. A malformed function map is an
    ArtifactError, raised before TVM sees any of it. While the hook is swapped, another
    thread's CUDA key sees a function of unknown owner and lowers uncached once (docs/cache.md).

    The result is checked against the payload: TVM's save of it must be exactly the payload
    (format, function map and text). Where the text is long for its kernels, that save (a
    fresh copy of the whole text) costs more than making the module a second time: then the
    same kernels and target are built again with a short marker for the text, and that twin
    must save to exactly (format, function map, marker) while the module returned is a `cuda`
    module; TVM keeps the text it is handed as the hook returned it, and both are made under
    the same lock and environment from the same input but for the hook's answer. Any difference
    is None (the caller falls back to a source module with the same text).
    """
    infos = function_infos(payload.fmap)  # ArtifactError: a malformed map never reaches TVM
    remove = getattr(_compat.tvm_ffi, "remove_global_func", None)
    if payload.fmt != FALLBACK_FMT or remove is None:
        return None
    try:
        code = str(payload.code, "utf-8")
        kernels = _empty_kernels(infos)
        target = Target(target if target is not None else _DEFAULT_TARGET)
    except (ArtifactError, UnicodeDecodeError, RuntimeError, TypeError, ValueError):
        return None
    build = codegen_function("target.build.cuda")
    owner = threading.get_ident()
    twin = len(payload.code) > _TWIN_ABOVE * len(infos)
    answer = [_MARKER if twin else code]
    with _fallback_lock:
        previous = _compat.tvm_ffi.get_global_func(_POSTPROC, allow_missing=True)

        def postproc(text, target):
            if threading.get_ident() == owner:
                return answer[0]
            return previous(text, target) if previous is not None else text

        _compat.tvm_ffi.register_global_func(_POSTPROC, postproc, override=True)
        try:
            with forced_fallback():
                checked = call_codegen_function("target.build.cuda", build, kernels, target)
                if twin:
                    answer[0] = code
                    module = call_codegen_function("target.build.cuda", build, kernels, target)
                else:
                    module = checked
        except (RuntimeError, TypeError, ValueError):
            return None
        finally:
            if previous is None:
                remove(_POSTPROC)
            else:
                _compat.tvm_ffi.register_global_func(_POSTPROC, previous, override=True)  # the same handle
    try:
        expected = CudaPayload(payload.fmt, payload.fmap, _MARKER_BYTES) if twin else payload
        if module.kind != "cuda" or not saves_as(checked, expected):
            return None
    except (ArtifactError, RuntimeError, struct.error):
        return None
    return module


def _empty_kernels(infos: dict[str, dict]) -> IRModule:
    """Kernels with nothing in their bodies whose function map is `infos` (function_infos' form).

    Kernels of one signature share one PrimFunc but for their attributes: making the
    parameters and the function per kernel would be most of a many-kernel hit
    (docs/benchmarks.md at 5788f7c, "Figures behind code comments"); the module target.build.cuda makes
    from them is checked by the caller.
    """
    tirx, ir = _compat.tvm.tirx, _compat.tvm.ir
    functions, bases = {}, {}
    body = tirx.Evaluate(tirx.const(0, "int32"))
    for symbol, info in infos.items():
        if info["name"] != symbol or len(info["arg_extra_tags"]) != len(info["arg_types"]):
            raise ValueError(f"function map entry {symbol!r} is not one target.build.cuda makes")
        signature = (tuple(info["arg_types"]), tuple(info["arg_extra_tags"]))
        base = bases.get(signature)
        if base is None:
            params = []
            for i, (dtype, extra) in enumerate(zip(*signature)):
                if extra == _TENSOR_MAP:
                    params.append(tirx.Var(f"arg{i}", ir.PointerType(ir.TensorMapType())))
                elif dtype == "handle":
                    params.append(tirx.Var(f"arg{i}", ir.PointerType(ir.PrimType("uint8"))))
                else:
                    params.append(tirx.Var(f"arg{i}", dtype))
            base = bases[signature] = tirx.PrimFunc(params, body)
        functions[symbol] = base.with_attrs({
            "global_symbol": symbol, "calling_conv": 2,  # CallingConv::kDeviceKernelLaunch
            "tirx.kernel_launch_params": list(info["launch_param_tags"]), "tirx.noalias": True})
    return IRModule(functions)
