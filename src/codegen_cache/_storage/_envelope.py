"""The envelope of a remote value: signed framed bytes, and what a reader may conclude when they fail.

Layout (the framed artifact of `_artifacts` inside it):
    magic b"CGCR" | u8 envelope version | u8 signature length (0 or 32) | signature | frame

The signature is HMAC-SHA256 over the Redis key and the frame, so an entry signed for one key
is rejected under another. Nothing read is unpickled: a value must pass the envelope, the
signature and the frame checks before the cache decodes it.

A rejected value is one of two things, and the difference decides whether a host may write
over it (`Rejection.damaged`):
- damaged for every reader: no envelope (wrong magic, too short, a bad signature length), or a
  frame whose lengths or checksum are wrong. No reader can use it, whatever its secret, so the
  rebuild replaces it;
- not usable *here*: a bad signature (another secret's entry and a tampered one look the
  same), an unsigned entry where a secret is set, an envelope version this reader does not
  know (a newer writer), a value over this host's size cap. Another host may use it, so it is
  left alone: a host never replaces an entry it cannot verify.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import NamedTuple

from .._artifacts import Artifact, unframe
from .._errors import ArtifactError

__all__ = ["ENVELOPE_BYTES", "Opened", "Rejection", "open_value", "seal"]

_MAGIC = b"CGCR"
_ENVELOPE_VERSION = 1
_HEAD = struct.Struct("<4sBB")
_SIG_LEN = hashlib.sha256().digest_size
ENVELOPE_BYTES = _HEAD.size + _SIG_LEN  # the most the envelope adds to a frame


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a remote value was not loaded; `kind` is damaged, signature, unsigned, version or cap."""

    kind: str
    reason: str

    @property
    def damaged(self) -> bool:
        """Damaged for every reader (so it may be replaced), not merely unusable here."""
        return self.kind == "damaged"


class Opened(NamedTuple):
    """A value that passed every check: its frame (a read-only view of the value), codec, and the frame unframed."""

    frame: memoryview
    codec: str
    artifact: Artifact  # unframe(frame, info=False, views=True): a reader decodes it without unframing again


def _signature(secret: bytes, name: str, blob: bytes | memoryview) -> bytes:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    mac.update(name.encode() + b"\0")
    mac.update(blob)
    return mac.digest()


def seal(name: str, blob: bytes, secret: bytes | None) -> bytes:
    """The value to store under the Redis key `name` for the frame `blob`."""
    signature = _signature(secret, name, blob) if secret is not None else b""
    return _HEAD.pack(_MAGIC, _ENVELOPE_VERSION, len(signature)) + signature + blob


def open_value(name: str, value: bytes | bytearray, secret: bytes | None) -> Opened | Rejection:
    """The frame inside `value` after every check (`Opened`), or why it was rejected.

    The frame is a view of `value`, not a copy: the caller must not change `value` afterwards.
    """
    if len(value) < _HEAD.size:
        return Rejection("damaged", f"{len(value)} bytes is shorter than the remote envelope")
    magic, version, sig_len = _HEAD.unpack_from(value, 0)
    if magic != _MAGIC:
        return Rejection("damaged", f"bad remote envelope {bytes(value[:5])!r}")
    if version != _ENVELOPE_VERSION:
        return Rejection("version", f"envelope version {version}, this reader knows {_ENVELOPE_VERSION} "
                                    "(written by a newer codegen-cache?)")
    if sig_len not in (0, _SIG_LEN) or len(value) < _HEAD.size + sig_len:
        return Rejection("damaged", f"bad signature length {sig_len}")
    view = memoryview(value).toreadonly()
    signature, blob = bytes(view[_HEAD.size : _HEAD.size + sig_len]), view[_HEAD.size + sig_len :]
    # The frame first: a bad frame is damaged for every reader, whoever signed it.
    try:
        artifact = unframe(blob, info=False, views=True)  # framing, format version, checksum
    except ArtifactError as err:
        return Rejection("damaged", str(err))
    if secret is not None:
        if not signature:
            return Rejection("unsigned", "entry is not signed (a shared secret is configured here)")
        if not hmac.compare_digest(signature, _signature(secret, name, blob)):
            return Rejection("signature", "bad signature (written with another secret, or tampered with)")
    return Opened(blob, artifact.codec, artifact)
