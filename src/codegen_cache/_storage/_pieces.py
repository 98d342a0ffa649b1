"""A large remote value in pieces: each piece fits what one value of the tier may hold.

An entry larger than a tier's piece size (a model's weights) is stored as pieces and a manifest:

    manifest   under the entry's own name: a frame of codec "pieces" whose meta lists each
               piece's SHA-256 and size, and the whole entry's size (signed like any entry)
    pieces     under names made of their SHA-256 (`piece:<sha256>` / `piece/<sha256>`): raw
               bytes, content-addressed, so two hosts that store the same entry at once write
               the same bytes under the same names, and a create-only put that finds a piece
               there finds that piece

A reader opens the manifest (envelope, signature, frame), reads each piece with the size the
manifest gives as its cap, checks each piece's SHA-256 (the signed manifest pins them: a piece
cannot be swapped without the secret), joins them and checks the whole frame. A piece that is
missing, of another size or hash, is a miss: nothing of it is decoded. The manifest is written
last, so a reader never finds a manifest whose pieces were not all stored first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from .._artifacts import frame, read_meta, unframe
from .._errors import ArtifactError
from ._envelope import Opened, Rejection

__all__ = ["MAX_PIECES", "PIECES_CODEC", "join", "manifest", "pieces_of", "split"]

PIECES_CODEC = "pieces"
MAX_PIECES = 4096


def split(blob: bytes, piece_bytes: int) -> tuple[bytes, list[tuple[str, memoryview]]]:
    """(the manifest frame, [(sha256 hex, piece)]) of a framed entry `blob`."""
    view = memoryview(blob)
    pieces = [view[i : i + piece_bytes] for i in range(0, len(view), piece_bytes)]
    named = [(hashlib.sha256(piece).hexdigest(), piece) for piece in pieces]
    meta = {"size": len(blob), "pieces": [[name, len(piece)] for name, piece in named]}
    return frame(PIECES_CODEC, meta, []), named


def pieces_of(opened: Opened, cap: int) -> list[tuple[str, int]] | Rejection:
    """The (sha256, size) of each piece a checked manifest names; a Rejection when it is malformed or over `cap`."""
    try:
        meta = read_meta(opened.frame)[1]  # its descriptive meta too (the checked artifact has the hot part alone)
    except ArtifactError:
        return Rejection("damaged", "a malformed manifest of pieces")
    listed, size = meta.get("pieces"), meta.get("size")
    if not isinstance(listed, list) or not isinstance(size, int) or not 0 < len(listed) <= MAX_PIECES:
        return Rejection("damaged", "a malformed manifest of pieces")
    pieces = []
    for item in listed:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and len(item[0]) == 64
                and isinstance(item[1], int) and item[1] > 0):
            return Rejection("damaged", "a malformed piece in a manifest")
        pieces.append((item[0], item[1]))
    if sum(p[1] for p in pieces) != size:
        return Rejection("damaged", "a manifest whose pieces do not add up to its size")
    if size > cap:
        return Rejection("cap", f"it is {size} bytes in {len(pieces)} pieces, over this host's cap of {cap} "
                                "(CODEGEN_CACHE_REMOTE_MAX_ENTRY)")
    return pieces


def join(pieces: list[tuple[str, int]], read: Callable[[str, int], bytes | None]) -> Opened | Rejection | None:
    """The entry the pieces make, checked: read(sha256, size) gives a piece's bytes (None: missing).

    None when a piece is missing (a miss: another host may still be storing it, or it was
    evicted); a Rejection when one is not what the manifest says, or the whole is not a frame.
    """
    whole = bytearray()
    for name, size in pieces:
        piece = read(name, size)
        if piece is None:
            return None
        if len(piece) != size or hashlib.sha256(piece).hexdigest() != name:
            return Rejection("damaged", f"piece {name[:16]} is not the one its manifest names")
        whole += piece
    try:
        artifact = unframe(whole, info=False, views=True)
    except ArtifactError as err:
        return Rejection("damaged", f"its pieces make no entry: {err}")
    return Opened(memoryview(whole).toreadonly(), artifact.codec, artifact)


def manifest(opened: Opened) -> bool:
    """Whether a checked value is a manifest of pieces (not an entry itself)."""
    return opened.codec == PIECES_CODEC
