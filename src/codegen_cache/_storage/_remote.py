"""A shared remote tier on Redis: signed, checksummed artifact bytes under namespaced keys.

Value layout (the framed artifact of `_artifacts` inside a small envelope):
    magic b"CGCR" | u8 envelope version | u8 signature length (0 or 32) | signature | frame

The signature is HMAC-SHA256 over the Redis key and the frame, so an entry signed for one key
is rejected under another. Nothing read from Redis is unpickled: a value is bytes that must
pass the envelope, signature and frame checks before the cache decodes it.

Every Redis call has one deadline (`timeout`, connecting and TLS included) and no retries; the
client (`_resp`) parses replies strictly and reads a value only if its announced length is
within the entry size cap. A failed call (refused, reset, past the deadline, a malformed or
unexpected reply) is a miss, counted, and puts the tier offline for a backoff that doubles up
to a cap; while offline, get() and put() return at once, so a down, slow, refusing or
misbehaving Redis costs a compile at most one deadline per backoff period. A value over the
cap is a rejected entry, not an outage: it is not read, and the rebuild replaces it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import struct
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from .._artifacts import FORMAT_VERSION, unframe
from .._config import REMOTE_ACCEPTED, check_remote_url, redact_url
from .._errors import ArtifactError, ConfigError, RemoteValueTooLargeError
from .._forksafe import on_fork_child
from ._resp import Endpoint, RespClient

__all__ = ["DEFAULT_MAX_ENTRY_BYTES", "DEFAULT_TIMEOUT", "DEFAULT_TTL", "RedisTier", "check_url"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_ENTRY_BYTES = 32 << 20
DEFAULT_TTL = 14 * 86400.0
DEFAULT_TIMEOUT = 0.5
_MAGIC = b"CGCR"
_ENVELOPE_VERSION = 1
_HEAD = struct.Struct("<4sBB")
_SIG_LEN = hashlib.sha256().digest_size
_ACCEPTED_URLS = REMOTE_ACCEPTED
_LOOPBACK = ("localhost", "127.0.0.1", "::1")
_ABSENT_SECONDS = 1.0

EventSink = Callable[..., None]


# One URL checker for the variable, the CLI and this tier (_config.check_remote_url).
_redact = redact_url
check_url = check_remote_url


class RedisTier:
    """The remote tier: get(digest) -> framed bytes or None, put(digest, framed bytes), close()."""

    def __init__(
        self,
        url: str,
        *,
        secret: str | bytes | None = None,
        on_event: EventSink | None = None,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
        ttl: float = DEFAULT_TTL,
        timeout: float = DEFAULT_TIMEOUT,
        backoff: float = 5.0,
        max_backoff: float = 300.0,
        prefix: str = "codegen-cache",
    ) -> None:
        self.url = check_url(url)
        if isinstance(secret, str):
            secret = secret.encode()
        if secret is not None and not secret:
            raise ConfigError("remote_secret (CODEGEN_CACHE_REMOTE_SECRET)", "", "a non-empty shared secret")
        if not isinstance(max_entry_bytes, int) or isinstance(max_entry_bytes, bool) or max_entry_bytes <= 0:
            raise ConfigError("remote_max_entry_bytes", max_entry_bytes, "a whole number of bytes, 1 or more")
        for name, value in (("remote_ttl", ttl), ("timeout", timeout), ("backoff", backoff),
                            ("max_backoff", max_backoff)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(name, value, "a number of seconds, 0 or more")
        if timeout == 0:
            raise ConfigError("timeout", timeout, "a number of seconds above 0 (0 would mean no timeout)")
        self._secret = secret
        self._on_event = on_event
        self.max_entry_bytes = max_entry_bytes
        self.ttl = float(ttl)
        self.timeout = float(timeout)
        self.backoff = float(backoff)
        self.max_backoff = max(float(max_backoff), self.backoff)
        # The format version is in the prefix: readers of another layout never see these keys.
        self.prefix = f"{prefix}:v{FORMAT_VERSION}:"
        try:
            # Nothing connects here: the first get or put does.
            self._client = RespClient(Endpoint.from_url(self.url, self.timeout))
        except ValueError as err:
            raise ConfigError("remote (CODEGEN_CACHE_REMOTE)", _redact(url), f"{_ACCEPTED_URLS} ({err})") from None
        # A stored value is the frame plus the envelope; nothing longer is read.
        self._read_limit = max_entry_bytes + _HEAD.size + _SIG_LEN
        self._lock = threading.Lock()
        on_fork_child(self._after_fork)
        self._offline_until = 0.0
        self._next_backoff = self.backoff
        self._warned = False
        self._warned_rejected = False
        # digest -> when Redis last answered "missing" or "rejected" for it. The cache looks a key
        # up twice on a cold miss (before and after taking its compile lease) and every 20 ms
        # while another local process builds it; remembering the answer for a moment saves those
        # round trips, and counts and logs a bad entry once per read rather than once per poll.
        self._absent: dict[str, float] = {}
        if secret is None and urlsplit(url).scheme != "unix" and urlsplit(url).hostname not in _LOOPBACK:
            logger.warning(
                "codegen cache: remote entries at %s are not signed; anyone who can write to that Redis "
                "can make this process load code of their choosing. Set CODEGEN_CACHE_REMOTE_SECRET.",
                _redact(url),
            )

    def __repr__(self) -> str:
        return f"RedisTier({_redact(self.url)!r}, signed={self._secret is not None})"

    @property
    def signed(self) -> bool:
        """Whether entries are signed and checked with a shared secret."""
        return self._secret is not None

    def redis_key(self, digest: str) -> str:
        """The Redis key of a cache key digest."""
        return self.prefix + digest

    # ---- the tier -------------------------------------------------------------------------

    def get(self, digest: str) -> bytes | None:
        """The framed artifact stored for `digest`, or None (missing, rejected, or offline)."""
        if self._is_offline():
            self._event("remote_offline")
            return None
        if self._recently_absent(digest):
            return None
        name = self.redis_key(digest)
        try:
            value = self._client.get(name.encode(), self._read_limit)
        except RemoteValueTooLargeError as err:
            self._rejected(digest, name, err)  # the server answered; one entry is bad
            return None
        except Exception as err:  # noqa: BLE001
            # OSError for every fault the client knows (refused, reset, deadline, TLS, a malformed
            # or error reply); anything else would be a bug in it, and an optional tier must not
            # break a compile for that either. Both are counted and logged as a failed call.
            self._failed("get", err)
            return None
        self._succeeded()
        if value is None:
            self._event("remote_misses")
            self._absent[digest] = time.monotonic()
            return None
        try:
            return self._open(name, value)
        except ArtifactError as err:
            self._rejected(digest, name, err)
            return None

    def put(self, digest: str, blob: bytes) -> bool:
        """Store a framed artifact under `digest` with the TTL; False when skipped or failed."""
        if len(blob) > self.max_entry_bytes:
            self._event("remote_skipped")
            logger.debug("codegen cache: not storing %s remotely: %d bytes is over the cap of %d",
                         digest[:16], len(blob), self.max_entry_bytes)
            return False
        if self._is_offline():
            self._event("remote_offline")
            return False
        self._absent.pop(digest, None)
        name = self.redis_key(digest)
        value = self._seal(name, blob)
        try:
            # Plain SET, not NX: a rejected (garbled or badly signed) entry is replaced by the rebuild.
            self._client.set(name.encode(), value, px=int(self.ttl * 1000) or None)
        except Exception as err:  # noqa: BLE001 - as in get()
            self._failed("put", err)
            return False
        self._succeeded()
        self._event("remote_stores")
        return True

    def close(self) -> None:
        """Close the connections to Redis."""
        try:
            self._client.close()
        except OSError as err:
            logger.debug("codegen cache: closing %s: %s", _redact(self.url), err)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread of the parent may have held it

    # ---- envelope -------------------------------------------------------------------------

    def _signature(self, name: str, blob: bytes | memoryview) -> bytes:
        assert self._secret is not None
        mac = hmac.new(self._secret, digestmod=hashlib.sha256)
        mac.update(name.encode() + b"\0")
        mac.update(blob)
        return mac.digest()

    def _seal(self, name: str, blob: bytes) -> bytes:
        signature = self._signature(name, blob) if self._secret is not None else b""
        return _HEAD.pack(_MAGIC, _ENVELOPE_VERSION, len(signature)) + signature + blob

    def _open(self, name: str, value: bytes | bytearray) -> bytes:
        """The frame inside `value`, after the envelope, signature and frame checks."""
        if len(value) < _HEAD.size:
            raise ArtifactError(f"{len(value)} bytes is shorter than the remote envelope")
        magic, version, sig_len = _HEAD.unpack_from(value, 0)
        if magic != _MAGIC or version != _ENVELOPE_VERSION:
            raise ArtifactError(f"bad remote envelope {bytes(value[:5])!r}")
        if sig_len not in (0, _SIG_LEN) or len(value) < _HEAD.size + sig_len:
            raise ArtifactError(f"bad signature length {sig_len}")
        view = memoryview(value)
        signature, blob = bytes(view[_HEAD.size : _HEAD.size + sig_len]), view[_HEAD.size + sig_len :]
        if self._secret is not None:
            if not signature:
                raise ArtifactError("entry is not signed (a shared secret is configured)")
            if not hmac.compare_digest(signature, self._signature(name, blob)):
                raise ArtifactError("bad signature (written with another secret, or tampered with)")
        unframe(blob)  # framing, format version and checksum, before anything decodes it
        return bytes(blob)

    # ---- availability ---------------------------------------------------------------------

    def _rejected(self, digest: str, name: str, err: Exception) -> None:
        self._event("remote_rejected")
        self._absent[digest] = time.monotonic()
        first, self._warned_rejected = not self._warned_rejected, True
        (logger.warning if first else logger.debug)(
            "codegen cache: rejected remote entry %s (not loaded; rebuilt and replaced): %s", name, err)

    def _recently_absent(self, digest: str) -> bool:
        seen = self._absent.get(digest)
        if seen is not None and time.monotonic() - seen < _ABSENT_SECONDS:
            return True
        if len(self._absent) > 4096:
            # Dict operations are atomic under the GIL; a racing put at worst costs one extra GET.
            cutoff = time.monotonic() - _ABSENT_SECONDS
            self._absent = {d: t for d, t in list(self._absent.items()) if t > cutoff}
        return False

    def _is_offline(self) -> bool:
        return time.monotonic() < self._offline_until

    def _failed(self, op: str, err: BaseException) -> None:
        self._event("error:remote")
        with self._lock:
            if self._is_offline():
                return  # another thread already took it offline
            delay = self._next_backoff
            self._offline_until = time.monotonic() + delay
            self._next_backoff = min(delay * 2, self.max_backoff)
            first, self._warned = not self._warned, True
        # One warning per tier; later outages and retries log at DEBUG.
        (logger.warning if first else logger.debug)(
            "codegen cache: remote %s failed on %s (%s: %s); local-only for %.0fs, then retrying",
            _redact(self.url), op, type(err).__name__, err, delay,
        )

    def _succeeded(self) -> None:
        if self._next_backoff != self.backoff:
            with self._lock:
                self._next_backoff = self.backoff
            logger.info("codegen cache: remote %s is reachable again", _redact(self.url))

    def _event(self, name: str) -> None:
        if self._on_event is not None:
            self._on_event(name)

