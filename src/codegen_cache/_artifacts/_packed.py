"""LLVM IR as entries keep it: a zstd frame, or the plain text a miss staged.

The IR of an llvm entry is read only to export a hit, on a host that cannot load the stored
library, or to serve an entry not yet linked; it is most of an entry's bytes, and LLVM IR text
compresses well. So the writer thread packs it, at a fast level, before the entry reaches its
store and the remote (never the caller's thread: a miss stages the plain text), and the
upgrader, a background process that spends far longer emitting and linking, packs it again at
a level that makes it smaller. The shared library a hit maps is never packed: a hit copies it
as it is.

A field is packed when it starts with zstd's frame magic, which no LLVM IR text can start
with (0xB5 is not a first byte in UTF-8). A packed field must declare its size, and it is
unpacked into at most that many bytes; what fails is an ArtifactError (the entry is a miss).
The levels are chosen from docs/benchmarks.md at 5788f7c ("Entry sizes": size and time per level on real
IR); zstd is imported only where packing or unpacking happens. Where the `zstandard` package is
missing (a dependency left out of an install), entries are stored plain and a packed one is a
miss: a broken install costs size, never a compile.
"""

from __future__ import annotations

from .._errors import ArtifactError
from ._frame import frame, unframe

__all__ = ["FAST_LEVEL", "SMALL_LEVEL", "compact", "is_packed", "pack", "unpack"]

FAST_LEVEL = 1  # the writer thread's, once per miss
SMALL_LEVEL = 9  # the upgrader's
_MAGIC = b"\x28\xb5\x2f\xfd"
# Larger than any LLVM IR a codegen prints; a declared size above it is not allocated.
_MAX_TEXT = 1 << 31


def is_packed(field: bytes | memoryview) -> bool:
    """Whether an IR field is a zstd frame (else it is the text itself)."""
    return bytes(field[:4]) == _MAGIC


def _zstd():
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


def pack(text: bytes | memoryview, level: int = FAST_LEVEL) -> bytes | memoryview:
    """The IR text (not a packed field) as a zstd frame that declares its size (as it is without zstandard)."""
    zstandard = _zstd()
    if zstandard is None:
        return text
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(text)


def unpack(field: bytes | memoryview) -> bytes | memoryview:
    """The IR text of a field (the field itself where it is not packed); ArtifactError when malformed."""
    if not is_packed(field):
        return field
    zstandard = _zstd()
    if zstandard is None:
        raise ArtifactError("packed LLVM IR, and the zstandard package is not installed (pip install zstandard)")
    try:
        size = zstandard.frame_content_size(field)
        if size < 0 or size > _MAX_TEXT:
            raise ArtifactError(f"packed LLVM IR declares {size} bytes (expected 0 to {_MAX_TEXT})")
        text = zstandard.ZstdDecompressor().decompress(field, max_output_size=size)
    except zstandard.ZstdError as err:
        raise ArtifactError(f"packed LLVM IR is malformed ({err})") from None
    if len(text) != size:
        raise ArtifactError(f"packed LLVM IR unpacked to {len(text)} bytes, not the {size} it declares")
    return text


def compact(blob: bytes) -> bytes:
    """The entry as its store and the remote keep it: an llvm-ir entry's plain IR packed; others as they are.

    The frame is checked first: bytes that are not a valid frame are returned as they are (a
    reader's check rejects them), never framed again under a new checksum. The metadata is kept whole.
    """
    if b"llvm-ir" not in blob[-64:]:  # the codec name sits in the trailer, right before the footer
        return blob
    try:
        art = unframe(blob)
    except ArtifactError:
        return blob
    if art.codec != "llvm-ir" or len(art.fields) != 1 or is_packed(art.fields[0]) or _zstd() is None:
        return blob
    return frame(art.codec, art.meta, [pack(art.fields[0])])
