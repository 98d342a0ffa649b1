"""A compiled model's weights stored once, by content: the executable's tensor bytes as entries of their own.

A VMExecutable's bytes hold its constant pool: each tensor as TVM saves one (a magic number,
device, dtype, shape, byte count, then the raw bytes). `split` finds those byte runs of
MIN_SEGMENT bytes or more and cuts each into chunks of at most CHUNK_BYTES; every chunk is an
entry (codec "tensor-chunk") in the compiled store under the xxh3-128 digest of its bytes, so
the models that hold a tensor share its entries, and a model whose one tensor changed adds
that tensor's chunks alone. The model's entry keeps the rest (the skeleton) and names its chunks.

A chunk is found by scanning for the magic and reading the header after it; nothing depends on
that reading being TVM's: `join` puts back exactly the bytes `split` took out, at the offsets it
took them from, so the executable loaded on a hit is byte for byte the one serialized on the miss.

A model is served whole or not at all: a chunk that is absent, fails its frame's checksum or
is not the bytes its digest names (verify=True) makes the whole model a miss; the damaged chunk is
dropped and the compile stores it again.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Sequence
from typing import NamedTuple

import xxhash

from .._artifacts import frame, unframe
from .._cache import CodegenCache
from .._errors import ArtifactError
from .._log import warn_once
from .._storage._disk import STORAGE_ERRORS
from .._storage._layout import TENSOR_CODEC

__all__ = ["CHUNK_BYTES", "MIN_SEGMENT", "Chunk", "join", "parse_chunks", "read_chunks", "split", "store_chunks"]

logger = logging.getLogger(__name__)

MIN_SEGMENT = 64 << 10  # smaller tensors stay in the skeleton: an entry each would cost more than it shares
CHUNK_BYTES = 16 << 20  # an edit of part of a big tensor adds its chunks, not the tensor
_MODE = "compiled"
_MAGIC = struct.pack("<Q", 0xDD5E40F096B4A13F)  # TVM's tensor magic (kTVMNDArrayMagic)
_HEAD = struct.Struct("<QiiiBBH")  # reserved, device type, device id, ndim, dtype code, bits, lanes
_PREFIX = b"cgc-tensor-chunk\0"


class Chunk(NamedTuple):
    """One chunk of a model's weights: where it goes in the executable's bytes, its length and its digest."""

    at: int
    nbytes: int
    digest: str


def split(data: bytes, min_segment: int = MIN_SEGMENT) -> tuple[bytes, list[Chunk], list[memoryview]]:
    """(skeleton, chunks, the chunks' bytes as views of `data`) of a VMExecutable's bytes."""
    view = memoryview(data)
    chunks: list[Chunk] = []
    pieces: list[memoryview] = []
    skeleton: list[memoryview] = []
    kept = 0  # where the bytes not yet given to the skeleton start
    pos = data.find(_MAGIC)
    while pos >= 0:
        found = _segment(data, pos)
        if found is None or found[1] < min_segment:
            pos = data.find(_MAGIC, pos + len(_MAGIC) if found is None else found[0] + found[1])
            continue
        start, length = found
        skeleton.append(view[kept:start])
        for at in range(start, start + length, CHUNK_BYTES):
            piece = view[at:min(at + CHUNK_BYTES, start + length)]
            digest = xxhash.xxh3_128(_PREFIX)
            digest.update(piece)
            chunks.append(Chunk(at, len(piece), digest.hexdigest()))
            pieces.append(piece)
        kept = start + length
        pos = data.find(_MAGIC, kept)
    skeleton.append(view[kept:])
    return b"".join(skeleton), chunks, pieces


def _segment(data: bytes, pos: int) -> tuple[int, int] | None:
    """(start, length) of the raw bytes of the tensor whose header starts at `pos`, or None."""
    head = pos + len(_MAGIC)
    if head + _HEAD.size > len(data):
        return None
    _reserved, _dev_type, _dev_id, ndim, _code, bits, lanes = _HEAD.unpack_from(data, head)
    if not 0 <= ndim <= 16 or bits == 0 or lanes == 0:
        return None
    shape_at = head + _HEAD.size
    size_at = shape_at + 8 * ndim
    if size_at + 8 > len(data):
        return None
    count = 1
    for extent in struct.unpack_from(f"<{ndim}q", data, shape_at):
        if extent < 0:
            return None
        count *= extent
    (nbytes,) = struct.unpack_from("<q", data, size_at)
    start = size_at + 8
    if nbytes != (count * bits * lanes + 7) // 8 or start + nbytes > len(data):
        return None
    return start, nbytes


def join(skeleton: bytes | memoryview, chunks: Sequence[Chunk], pieces: Sequence[bytes | memoryview]) -> bytes:
    """The executable's bytes: the skeleton with each chunk put back at its offset (ArtifactError: they do not fit).

    One b"".join of views: each byte is copied once, into memory never zero-filled first.
    """
    skeleton = memoryview(skeleton)
    parts: list[bytes | memoryview] = []
    done = taken = 0  # bytes of the result laid out; bytes of the skeleton used
    for chunk, piece in zip(chunks, pieces):
        gap = chunk.at - done
        if gap < 0 or taken + gap > len(skeleton) or len(piece) != chunk.nbytes:
            raise ArtifactError(f"chunk at {chunk.at} does not fit the skeleton", kind=TENSOR_CODEC)
        parts += (skeleton[taken:taken + gap], piece)
        taken += gap
        done = chunk.at + chunk.nbytes
    parts.append(skeleton[taken:])
    return b"".join(parts)


def as_meta(chunks: Sequence[Chunk]) -> list[list]:
    """The chunks as a model entry's metadata keeps them."""
    return [[c.at, c.nbytes, c.digest] for c in chunks]


def parse_chunks(value: object) -> tuple[Chunk, ...]:
    """Chunks from a model entry's metadata; ArtifactError when malformed."""
    if not isinstance(value, list):
        raise ArtifactError("weights is not a list", kind=TENSOR_CODEC)
    chunks = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 3 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                    for v in item[:2])
                and isinstance(item[2], str) and len(item[2]) == 32):
            raise ArtifactError(f"malformed chunk {str(item)[:80]}", kind=TENSOR_CODEC)
        chunks.append(Chunk(*item))
    return tuple(chunks)


def store_chunks(cache: CodegenCache, chunks: Sequence[Chunk], pieces: Sequence[memoryview], *, staged: bool) -> bool:
    """Store every chunk not stored yet (one entry per distinct digest); False where one could not be."""
    done: set[str] = set()
    for chunk, piece in zip(chunks, pieces):
        if chunk.digest in done:
            continue
        done.add(chunk.digest)
        if cache.has_part(_MODE, chunk.digest):
            continue  # content-addressed: the entry there holds these bytes
        # "codegen" and "created" are for the command line's listing (ls: what made it, its age).
        blob = frame(TENSOR_CODEC, {"key": chunk.digest, "codegen": TENSOR_CODEC, "created": time.time()}, [piece])
        if not cache.put_part(_MODE, chunk.digest, blob, staged=staged):
            return False
    return True


def read_chunks(cache: CodegenCache, chunks: Sequence[Chunk], *, check_digest: bool) -> list[memoryview] | None:
    """Every chunk's bytes (views of their entries), or None when one is absent or damaged (it is dropped)."""
    pieces = []
    for chunk in chunks:
        try:
            blob = cache.entry_blob(_MODE, chunk.digest)
        except STORAGE_ERRORS as err:
            warn_once(logger, ("tensor-read", str(cache.directory)), "codegen cache: cannot read a model's "
                      "weights (%s: %s)", type(err).__name__, err)
            return None
        if blob is None:
            blob = cache.fetch_remote_entry(chunk.digest)  # another host stored it: this disk gets a copy
        if blob is None:
            return None  # evicted: the model compiles again, and stores it anew
        try:
            art = unframe(blob, info=False, views=True)
            if art.codec != TENSOR_CODEC or art.meta.get("key") != chunk.digest or len(art.fields) != 1 \
                    or len(art.fields[0]) != chunk.nbytes:
                raise ArtifactError(f"not chunk {chunk.digest[:16]}", kind=TENSOR_CODEC)
            if check_digest:
                digest = xxhash.xxh3_128(_PREFIX)
                digest.update(art.fields[0])
                if digest.hexdigest() != chunk.digest:
                    raise ArtifactError(f"bytes are not chunk {chunk.digest[:16]}", kind=TENSOR_CODEC)
        except ArtifactError as err:
            warn_once(logger, ("tensor-damaged", chunk.digest), "codegen cache: dropping a damaged weights "
                      "entry (%s); compiling the model again", err)
            cache.drop_part(_MODE, chunk.digest)
            return None
        pieces.append(art.fields[0])
    for chunk in chunks:
        cache.entry_used(_MODE, chunk.digest)  # served with its model: used now (eviction is LRU)
    return pieces
