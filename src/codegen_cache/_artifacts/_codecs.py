"""Framed artifact bytes and one codec per module kind. Nothing here pickles or unpickles.

Frame (little-endian):
    magic b"CGCA" | u16 format version | u8 codec length | codec name | u32 meta length |
    meta (UTF-8 JSON: what a hit needs) | u32 info length | info (UTF-8 JSON: descriptive,
    for tools; not parsed on a hit) | u64 payload length | u64 xxh3-64 of everything after
    the magic but the checksum itself | payload

The payload of each codec is a sequence of u64-length-prefixed fields.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
import xxhash
from tvm.runtime import Module

from .._errors import ArtifactError, CudaRuntimeUnavailableError
from .._key import ARTIFACT_FORMAT_VERSION
from ..codegens import cuda as cuda_codegen

__all__ = ["Artifact", "PendingArtifact", "decode", "encode", "encode_cuda_binary", "prepare", "read_meta", "unframe"]

MAGIC = b"CGCA"
_HEAD = struct.Struct("<4sHB")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_TAIL = struct.Struct("<QQ")
# Formats that runtime.SourceModuleCreate is given per fallback module kind.
# Metadata a hit reads; everything else goes to the info section, parsed only by tools.
HOT_META = frozenset({"key", "build_seconds", "source_format", "c_func_names", "module_kind", "ir_digest"})
# The JSON type of each of those; a checksum is not authentication, so a well-framed entry may
# still hold anything there (a null build_seconds made lower() raise TypeError).
_HOT_TYPES = {"key": str, "build_seconds": (int, float), "source_format": str, "c_func_names": list,
              "module_kind": str, "ir_digest": str}
_SOURCE_FORMATS = {"cuda": "cu", "opencl": "cl", "metal": "metal", "webgpu": "wgsl", "source": ""}


@dataclass(frozen=True, slots=True)
class Artifact:
    """An unframed artifact: codec name, metadata and payload fields."""

    codec: str
    meta: dict[str, Any]
    fields: tuple[bytes, ...]


def _pack_fields(fields: Sequence[bytes]) -> bytes:
    return b"".join(_U64.pack(len(f)) + f for f in fields)


def _unpack_fields(payload: bytes, codec: str) -> tuple[bytes, ...]:
    fields, pos = [], 0
    while pos < len(payload):
        if pos + 8 > len(payload):
            raise ArtifactError("payload field header is truncated", kind=codec)
        (length,) = _U64.unpack_from(payload, pos)
        end = pos + 8 + length
        if end > len(payload):
            raise ArtifactError(f"payload field of {length} bytes runs past the end", kind=codec)
        fields.append(payload[pos + 8 : end])
        pos = end
    return tuple(fields)


def frame(codec: str, meta: Mapping[str, Any], fields: Sequence[bytes]) -> bytes:
    """Frame a codec's fields with metadata and a checksum."""
    name = codec.encode("ascii")
    hot = {k: v for k, v in meta.items() if k in HOT_META}
    info = {k: v for k, v in meta.items() if k not in HOT_META}
    meta_bytes = json.dumps(hot, sort_keys=True, separators=(",", ":")).encode()
    info_bytes = json.dumps(info, sort_keys=True, separators=(",", ":")).encode()
    payload = _pack_fields(fields)
    body = (_HEAD.pack(MAGIC, ARTIFACT_FORMAT_VERSION, len(name)) + name + _U32.pack(len(meta_bytes)) + meta_bytes
            + _U32.pack(len(info_bytes)) + info_bytes)
    checksum = xxhash.xxh3_64(body[4:])
    checksum.update(_U64.pack(len(payload)))
    checksum.update(payload)
    return body + _TAIL.pack(len(payload), checksum.intdigest()) + payload


def _parse_header(blob: bytes | memoryview, info: bool = True) -> tuple[str, dict[str, Any], int, int, int]:
    if len(blob) < _HEAD.size:
        raise ArtifactError(f"{len(blob)} bytes is shorter than the frame header")
    magic, version, name_len = _HEAD.unpack_from(blob, 0)
    if magic != MAGIC:
        raise ArtifactError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if version != ARTIFACT_FORMAT_VERSION:
        raise ArtifactError(f"format version {version}, this reader knows {ARTIFACT_FORMAT_VERSION}")
    pos = _HEAD.size
    try:
        codec = bytes(blob[pos : pos + name_len]).decode("ascii")
        pos += name_len
        (meta_len,) = _U32.unpack_from(blob, pos)
        pos += 4
        if pos + meta_len > len(blob):
            raise ArtifactError(f"metadata of {meta_len} bytes runs past the end", kind=codec)
        meta = json.loads(bytes(blob[pos : pos + meta_len]))
        pos += meta_len
        (info_len,) = _U32.unpack_from(blob, pos)
        pos += 4
        if pos + info_len > len(blob):
            raise ArtifactError(f"info of {info_len} bytes runs past the end", kind=codec)
        if info:
            extra = json.loads(bytes(blob[pos : pos + info_len]))
            if not isinstance(extra, dict) or not isinstance(meta, dict):
                raise ArtifactError("metadata is not a JSON object", kind=codec)
            meta = {**extra, **meta}
        pos += info_len
        payload_len, checksum = _TAIL.unpack_from(blob, pos)
    except (UnicodeDecodeError, ValueError, struct.error) as err:
        if isinstance(err, ArtifactError):
            raise
        raise ArtifactError(f"frame header is malformed ({err})") from None
    if not isinstance(meta, dict):
        raise ArtifactError("metadata is not a JSON object", kind=codec)
    return codec, meta, pos, payload_len, checksum


def read_meta(blob: bytes | memoryview) -> tuple[str, dict[str, Any]]:
    """Codec name and metadata of a framed artifact, without checking the payload."""
    codec, meta, _pos, _len, _sum = _parse_header(blob)
    return codec, meta


def unframe(blob: bytes | memoryview, *, info: bool = True) -> Artifact:
    """Check the framing and checksum of `blob` and split it; ArtifactError when malformed.

    info=False leaves the descriptive metadata unparsed (the hit path needs only the rest).
    """
    codec, meta, pos, payload_len, checksum = _parse_header(blob, info)
    start = pos + _TAIL.size
    if start + payload_len != len(blob):
        raise ArtifactError(
            f"payload length {payload_len} does not match the {len(blob) - start} bytes present", kind=codec
        )
    digest = xxhash.xxh3_64(blob[4:pos])
    digest.update(blob[pos : pos + 8])
    digest.update(blob[start:])
    if digest.intdigest() != checksum:
        raise ArtifactError("checksum mismatch (the entry is corrupt)", kind=codec)
    return Artifact(codec, meta, _unpack_fields(bytes(blob[start:]), codec))


# ---- encoders -------------------------------------------------------------------------------


def _shared_library_from_ir(llvm_ir: str, scratch: str) -> bytes:
    """Compile LLVM IR text into a shared library, in a private LLVM module.

    The module handed to the caller is never touched here: TVM's LLVM module is not safe to
    emit code from while the caller JIT-runs, inspects or exports it in another thread.
    Re-parsing its IR gives a byte-identical object file (measured).
    """
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler (cc/gcc) to link the llvm module into a shared library")
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        ir, obj, lib = (os.path.join(tmp, name) for name in ("lib.ll", "lib.o", "lib.so"))
        with open(ir, "w") as f:
            f.write(llvm_ir)
        tvm.get_global_func("ffi.Module.load_from_file.ll")(ir, "ll").write_to_file(obj)
        done = subprocess.run([cc, "-shared", "-o", lib, obj], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise OSError(f"{cc} -shared failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        with open(lib, "rb") as f:
            return f.read()


class PendingArtifact:
    """What the caller's thread takes from a module; `finish` makes the bytes (may be slow)."""

    __slots__ = ("codec", "fields", "llvm_ir", "meta")

    def __init__(self, codec: str, meta: Mapping[str, Any], fields: Sequence[bytes] = (),
                 llvm_ir: str | None = None) -> None:
        self.codec = codec
        self.meta = dict(meta)
        self.fields = list(fields)
        self.llvm_ir = llvm_ir

    def finish(self, scratch: str, extra_meta: Mapping[str, Any] | None = None) -> bytes:
        """The framed artifact bytes (for llvm: compile the IR into a shared library now)."""
        fields = self.fields
        if self.llvm_ir is not None:
            fields = [_shared_library_from_ir(self.llvm_ir, scratch)]
        return frame(self.codec, {**self.meta, **(extra_meta or {})}, fields)


def prepare(module: Module, meta: Mapping[str, Any], *, func_names: Sequence[str]) -> PendingArtifact:
    """Take what is needed from `module` now (cheap), leaving slow work to `finish`."""
    if len(module.imports):
        raise ValueError(f"cannot cache a {module.kind} module with {len(module.imports)} imports")
    kind = module.kind
    meta = {**meta, "module_kind": kind, "func_names": list(func_names)}
    if kind == "llvm":
        return PendingArtifact("llvm-so", meta, llvm_ir=module.inspect_source("ll"))
    if kind == "cuda":
        payload = cuda_codegen.module_payload(module)
        if payload.fmt == "cuda":
            return PendingArtifact("source", {**meta, "source_format": "cu"}, [payload.code])
        source = module.inspect_source("cuda") or cuda_codegen.recall_source(payload.code) or ""
        return PendingArtifact("cuda-bin", meta, [payload.fmt.encode(), payload.fmap, payload.code, source.encode()])
    if kind == "c":
        # The C module's function names are not readable; probe the names TVM gives them.
        probes = [p for n in func_names for p in (f"__tvm_ffi_{n}", n)] + ["__tvm_ffi_main"]
        exported = [p for p in probes if module.implements_function(p)]
        return PendingArtifact("c", {**meta, "c_func_names": exported}, [module.inspect_source("").encode()])
    fmt = _SOURCE_FORMATS.get(kind, kind)
    return PendingArtifact("source", {**meta, "source_format": fmt}, [module.inspect_source("").encode()])


def encode(module: Module, meta: Mapping[str, Any], *, func_names: Sequence[str], scratch: str) -> bytes:
    """Frame a runtime module: llvm as a shared library, CUDA binaries, c and source modules."""
    return prepare(module, meta, func_names=func_names).finish(scratch)


def encode_cuda_binary(payload: cuda_codegen.CudaPayload, source: str, meta: Mapping[str, Any],
                       *, func_names: Sequence[str]) -> bytes:
    """Frame a compiled CUDA payload without loading it (a GPU-less host filling a cache)."""
    meta = {**meta, "module_kind": "cuda", "func_names": list(func_names)}
    return frame("cuda-bin", meta, [payload.fmt.encode(), payload.fmap, payload.code, source.encode()])


# ---- decoders -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _global(name: str):
    """A TVM global function, looked up once (these are registered when tvm is imported)."""
    return tvm.get_global_func(name)


def _load_shared_library(data: bytes, scratch: str) -> Module:
    # dlopen needs a file; it stays mapped after the unlink.
    fd, path = tempfile.mkstemp(suffix=".so", dir=scratch)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return tvm.runtime.load_module(path)
    finally:
        os.unlink(path)


def decode(blob: bytes | memoryview, *, scratch: str) -> tuple[Module, dict[str, Any]]:
    """Rebuild the runtime module of a framed artifact; ArtifactError when malformed.

    The returned metadata holds what a hit needs (key, build_seconds, ...), not the info part.
    """
    art = unframe(blob, info=False)
    for name, types in _HOT_TYPES.items():
        if name in art.meta and not isinstance(art.meta[name], types):
            raise ArtifactError(f"metadata {name!r} is a {type(art.meta[name]).__name__}", kind=art.codec)
    if not all(isinstance(n, str) for n in art.meta.get("c_func_names", ())):
        raise ArtifactError("metadata 'c_func_names' holds a non-string", kind=art.codec)
    expected = {"llvm-so": 1, "cuda-bin": 4, "c": 1, "source": 1}
    if art.codec not in expected:
        raise ArtifactError(f"unknown codec {art.codec!r}; known: {sorted(expected)}")
    if len(art.fields) != expected[art.codec]:
        raise ArtifactError(f"{len(art.fields)} payload fields, expected {expected[art.codec]}", kind=art.codec)
    try:
        return _decode_fields(art, scratch), art.meta
    except (ArtifactError, CudaRuntimeUnavailableError):
        raise
    except (struct.error, UnicodeDecodeError) as err:
        raise ArtifactError(f"payload is malformed ({err})", kind=art.codec) from None
    except (RuntimeError, ValueError) as err:  # what TVM's loaders raise on bad bytes
        first = str(err).strip().splitlines()[-1:] or [""]
        raise ArtifactError(f"TVM could not load the payload ({first[0][:200]})", kind=art.codec) from None


def _decode_fields(art: Artifact, scratch: str) -> Module:
    if art.codec == "llvm-so":
        return _load_shared_library(art.fields[0], scratch)
    if art.codec == "cuda-bin":
        fmt, fmap, code, source = art.fields
        if fmt not in (b"fatbin", b"cubin", b"ptx") or not code:
            raise ArtifactError(f"CUDA binary format {fmt[:16]!r} or empty code", kind=art.codec)
        # Parse the whole payload before handing it to TVM's loader.
        payload = cuda_codegen.CudaPayload.from_bytes(cuda_codegen.CudaPayload(fmt.decode("ascii"), fmap, code).to_bytes())
        module = cuda_codegen.load_cuda_payload(payload)
        cuda_codegen.remember_source(code, source.decode())
        return module
    if art.codec == "c":
        names = [str(n) for n in art.meta.get("c_func_names", [])]
        return _global("runtime.CSourceModuleCreate")(art.fields[0].decode(), "c", names, [])
    text = art.fields[0].decode()
    return _global("runtime.SourceModuleCreate")(text, str(art.meta.get("source_format", "")))
