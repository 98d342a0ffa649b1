"""The frame around every stored value: payload first, metadata and a checksum in a trailer.

Layout (little-endian), version 3:

    field 0 | field 1 | ... | meta (UTF-8 JSON: what a hit needs) | info (UTF-8 JSON:
    descriptive, for tools; not parsed on a hit) | codec name (ASCII) | u64 length of each
    field | footer

    footer: u64 payload length | u32 meta length | u32 info length | u16 field count |
            u8 codec name length | u8 reserved | u16 format version |
            u64 xxh3-64 of every byte before the checksum | b"CGCA"

The payload comes first, so a stored shared library starts at offset 0 of the bytes (a hit
loads a private copy of just that field, never the value file: _private.py). Everything is
found from the fixed-size footer at the end.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import xxhash

from .._errors import ArtifactError

__all__ = ["CODEC_FIELDS", "check", "FORMAT_VERSION", "HOT_META", "MAGIC", "Artifact", "frame", "read_meta", "unframe"]

# Bump when the frame or a codec's payload changes: the version is also a key part, so entries
# of another layout are never looked up, and the remote tier's key prefix.
FORMAT_VERSION = 5  # 5: llvm entries keep their LLVM IR packed (zstd, _packed.py)
# codec -> the number of payload fields its decoder takes (_codecs.CODECS); kept here, without
# the decoders, so that listing and checking entries needs no TVM.
CODEC_FIELDS = {"llvm-ir": 1, "llvm-so": 2, "cuda-bin": 4, "cuda-module": 4, "cuda-fallback": 2, "c": 1, "source": 1}
# The JSON type of each metadata field a hit reads; a checksum is not authentication, so a
# well-framed entry may still hold anything there (a null number must not make lower() raise).
_HOT_TYPES = {"key": str, "build_seconds": (int, float), "source_format": str, "c_func_names": list,
              "func_names": list, "module_kind": str, "ir_digest": str, "llvm_queries": dict, "property_mask": int,
              "triple": str}
MAGIC = b"CGCA"
_FOOTER = struct.Struct("<QIIHBBHQ4s")
_U64 = struct.Struct("<Q")
# Metadata a hit reads; everything else goes to the info section, parsed only by tools.
# "build_seconds" holds a codegen run's seconds (codegen_seconds everywhere else): the stored
# name stays: renaming it would change the format of every entry.
HOT_META = frozenset({"key", "build_seconds", "source_format", "c_func_names", "func_names", "module_kind",
                      "ir_digest", "llvm_queries", "property_mask", "triple"})


class Artifact(NamedTuple):
    """An unframed artifact: codec name, metadata and payload fields (bytes, or views of the blob)."""

    codec: str
    meta: dict[str, Any]
    fields: tuple[bytes | memoryview, ...]


def frame(codec: str, meta: Mapping[str, Any], fields: Sequence[bytes]) -> bytes:
    """Frame a codec's fields with metadata and a checksum."""
    name = codec.encode("ascii")
    hot_meta, info_meta = {}, {}
    for k, v in meta.items():
        (hot_meta if k in HOT_META else info_meta)[k] = v
    hot = json.dumps(hot_meta, sort_keys=True, separators=(",", ":")).encode()
    info = json.dumps(info_meta, sort_keys=True, separators=(",", ":")).encode()
    lengths = b"".join([_U64.pack(len(f)) for f in fields])
    payload_len = sum([len(f) for f in fields])
    head = _FOOTER.pack(payload_len, len(hot), len(info), len(fields), len(name), 0, FORMAT_VERSION, 0, MAGIC)[:-12]
    parts = [*fields, hot, info, name, lengths, head]
    checksum = xxhash.xxh3_64()
    for part in parts:  # checksummed piece by piece: the payload is copied once, into the frame
        checksum.update(part)
    parts += (_U64.pack(checksum.intdigest()), MAGIC)
    return b"".join(parts)


class _Layout(NamedTuple):
    codec: str
    meta_start: int
    meta_len: int
    info_len: int
    field_lengths: tuple[int, ...]
    checksum: int
    end: int  # where the checksummed bytes end


def _layout(blob: bytes | memoryview) -> _Layout:
    size = len(blob)
    if size < _FOOTER.size:
        raise ArtifactError(f"{size} bytes is shorter than the frame footer")
    payload_len, meta_len, info_len, n_fields, name_len, _r, version, checksum, magic = _FOOTER.unpack_from(
        blob, size - _FOOTER.size)
    if magic != MAGIC:
        raise ArtifactError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"format version {version}, this reader knows {FORMAT_VERSION}")
    tail = _FOOTER.size + 8 * n_fields + name_len
    if payload_len + meta_len + info_len + tail != size:
        raise ArtifactError(f"section lengths add up to {payload_len + meta_len + info_len + tail}, "
                            f"not the {size} bytes present")
    lengths_at = size - _FOOTER.size - 8 * n_fields
    lengths = tuple(_U64.unpack_from(blob, lengths_at + 8 * i)[0] for i in range(n_fields))
    if sum(lengths) != payload_len:
        raise ArtifactError(f"field lengths add up to {sum(lengths)}, not the payload's {payload_len}")
    try:
        codec = bytes(blob[lengths_at - name_len : lengths_at]).decode("ascii")
    except UnicodeDecodeError:
        raise ArtifactError("codec name is not ASCII") from None
    return _Layout(codec, payload_len, meta_len, info_len, lengths, checksum, size - 12)


def _json_object(data: bytes | memoryview, what: str, codec: str) -> dict[str, Any]:
    try:
        value = json.loads(bytes(data))
    except (UnicodeDecodeError, ValueError) as err:
        raise ArtifactError(f"{what} is not JSON ({err})", kind=codec) from None
    if not isinstance(value, dict):
        raise ArtifactError(f"{what} is not a JSON object", kind=codec)
    return value


def _meta(blob: bytes | memoryview, layout: _Layout, info: bool) -> dict[str, Any]:
    start = layout.meta_start
    meta = _json_object(blob[start : start + layout.meta_len], "metadata", layout.codec)
    if info:
        start += layout.meta_len
        meta = {**_json_object(blob[start : start + layout.info_len], "info", layout.codec), **meta}
    return meta


def read_meta(blob: bytes | memoryview) -> tuple[str, dict[str, Any]]:
    """Codec name and metadata of a framed artifact, without checking the payload."""
    layout = _layout(blob)
    return layout.codec, _meta(blob, layout, True)


def unframe(blob: bytes | memoryview, *, info: bool = True, views: bool = False) -> Artifact:
    """Check the framing and checksum of `blob` and split it; ArtifactError when malformed.

    info=False leaves the descriptive metadata unparsed (the hit path needs only the rest);
    views=True gives the fields as read-only views of `blob`, not copies (a hit copies a
    shared library only if it is exported, and decodes its LLVM IR only if it is asked for).
    """
    layout = _layout(blob)
    whole = memoryview(blob)
    if xxhash.xxh3_64_intdigest(whole[: layout.end]) != layout.checksum:
        raise ArtifactError("checksum mismatch (the entry is corrupt)", kind=layout.codec)
    if views:
        whole = whole.toreadonly()
    fields, pos = [], 0
    for length in layout.field_lengths:
        fields.append(whole[pos : pos + length] if views else bytes(blob[pos : pos + length]))
        pos += length
    return Artifact(layout.codec, _meta(blob, layout, info), tuple(fields))


def check(art: Artifact) -> None:
    """ArtifactError unless `art` is an entry a hit can decode: known codec, fields, metadata types."""
    for name, types in _HOT_TYPES.items():
        if name in art.meta and not isinstance(art.meta[name], types):
            raise ArtifactError(f"metadata {name!r} is a {type(art.meta[name]).__name__}", kind=art.codec)
    for names in ("c_func_names", "func_names"):
        if not all(isinstance(n, str) for n in art.meta.get(names, ())):
            raise ArtifactError(f"metadata {names!r} holds a non-string", kind=art.codec)
    if art.codec not in CODEC_FIELDS:
        raise ArtifactError(f"unknown codec {art.codec!r}; known: {sorted(CODEC_FIELDS)}")
    expected = CODEC_FIELDS[art.codec]
    if len(art.fields) != expected:
        raise ArtifactError(f"{len(art.fields)} payload fields, expected {expected}", kind=art.codec)
