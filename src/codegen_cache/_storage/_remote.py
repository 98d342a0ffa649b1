"""A shared remote tier on Redis (one server or a cluster): signed entries that no host can spoil.

Keys, under `codegen-cache:v<format>:` (readers of another layout never see them):
    <digest>                  the entry in a form every host can load (for llvm: its LLVM IR)
    lib:<platform>:<digest>   an llvm entry linked into a shared library, for hosts of that platform
    lease:<digest>            the build lease of a key (fleet-wide single-flight, `_cache._flight`)
    piece:<sha256>            a piece of an entry larger than `piece_bytes` (`_pieces`: the entry's
                              key then holds the manifest that names its pieces)

Each value is a framed artifact in a signed envelope (`_envelope`). Writes never replace a
value they cannot verify: an entry is stored only where its key is absent (SET NX), or over a
value that this host read and found damaged for every reader (a script compares it first). A
lookup of an llvm build asks for the library of this host's platform first and serves it when
there is one (a library is never loaded from a key of another platform).

Every Redis call has one deadline (`timeout`, connecting, TLS and redirects included) and no
retries; the client (`_client`) parses replies strictly and reads a value only if its
announced length is within the size cap. A failed call is a miss or a skipped write, counted,
and takes its kind of call offline for a backoff (`_backoff`: reads and writes apart, so a
refused write never stops reads); every failure the client reports is an OSError, or a
ConfigError for a URL a cluster cannot serve (then the tier stays off in this process).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from .. import _artifacts
from .._artifacts import FORMAT_VERSION, read_meta, unframe
from .._config import REMOTE_ACCEPTED, Settings, check_remote_url, redact_url, split_remote_urls
from .._errors import ArtifactError, ConfigError, RemoteValueTooLargeError
from ._client import RespClient
from ._endpoint import Endpoint
from ._envelope import ENVELOPE_BYTES, Opened, Rejection, open_value, seal
from ._health import FAILED, Health
from ._leases import Leases
from ._pieces import join, manifest, pieces_of, split
from ._platform import library_platform
from ._scripts import REFRESH, REPLACE

__all__ = ["DEFAULT_LEASE", "DEFAULT_MAX_ENTRY_BYTES", "DEFAULT_TIMEOUT", "DEFAULT_TTL", "RedisTier", "check_url"]

logger = logging.getLogger(__name__)

# A tier made without these options gets the settings' defaults (one place: _config.Settings).
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(Settings)}
DEFAULT_MAX_ENTRY_BYTES: int = _DEFAULTS["remote_max_entry_bytes"]
DEFAULT_TTL: float = _DEFAULTS["remote_ttl"]
DEFAULT_TIMEOUT: float = _DEFAULTS["remote_timeout"]
DEFAULT_LEASE: float = _DEFAULTS["remote_lease"]
_LOOPBACK = ("localhost", "127.0.0.1", "::1")
_ABSENT_SECONDS = 1.0
_REFRESH_FRACTION = 8  # a hit refreshes an entry's TTL once an eighth of it has passed
_MEMO_ENTRIES = 4096
# An entry larger than this is stored in pieces (`_pieces`): one value stays a short GET, far
# below Redis's proto-max-bulk-len (512 MB), however large a model's weights are.
PIECE_BYTES = 8 << 20

EventSink = Callable[..., None]

# One URL checker for the variable, the CLI and this tier (_config.check_remote_url).
_redact = redact_url
check_url = check_remote_url


class RedisTier:
    """The remote tier: get/fetch(digest) -> framed bytes or None, put/push(digest, framed bytes), leases, close()."""

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
        read_only: bool = False,
        lease: float = DEFAULT_LEASE,
        piece_bytes: int = PIECE_BYTES,
    ) -> None:
        self.url = check_url(url)
        if urlsplit(self.url).scheme == "s3" or len(split_remote_urls(self.url)) > 1:
            raise ConfigError("remote (CODEGEN_CACHE_REMOTE)", _redact(url), "one redis://, rediss:// or unix:// URL "
                              "(an s3:// URL or a chain is opened by _storage._remotes.open_remote)")
        if isinstance(secret, str):
            secret = secret.encode()
        if secret is not None and not secret:
            raise ConfigError("remote_secret (CODEGEN_CACHE_REMOTE_SECRET)", "", "a non-empty shared secret")
        if not isinstance(max_entry_bytes, int) or isinstance(max_entry_bytes, bool) or max_entry_bytes <= 0:
            raise ConfigError("remote_max_entry_bytes", max_entry_bytes, "a whole number of bytes, 1 or more")
        for name, value in (("remote_ttl", ttl), ("timeout", timeout), ("backoff", backoff),
                            ("max_backoff", max_backoff), ("remote_lease", lease)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(name, value, "a number of seconds, 0 or more")
        if timeout == 0:
            raise ConfigError("timeout", timeout, "a number of seconds above 0 (0 would mean no timeout)")
        if not isinstance(read_only, bool):
            raise ConfigError("remote_read_only", read_only, "True or False")
        if not isinstance(piece_bytes, int) or isinstance(piece_bytes, bool) or piece_bytes <= 0:
            raise ConfigError("piece_bytes", piece_bytes, "a whole number of bytes, 1 or more")
        self._secret = secret
        self.max_entry_bytes = max_entry_bytes
        self.piece_bytes = piece_bytes
        self.ttl = float(ttl)
        self.timeout = float(timeout)
        self.read_only = read_only
        self.lease = float(lease)
        # The format version is in the prefix: readers of another layout never see these keys.
        self.prefix = f"{prefix}:v{FORMAT_VERSION}:"
        try:
            # Nothing connects here: the first call does, or connect_early (the cache calls it).
            self._client = RespClient(Endpoint.from_url(self.url, self.timeout))
        except ValueError as err:
            raise ConfigError("remote (CODEGEN_CACHE_REMOTE)", _redact(url), f"{REMOTE_ACCEPTED} ({err})") from None
        # A stored value is the frame plus the envelope; nothing longer is read.
        self._read_limit = max_entry_bytes + ENVELOPE_BYTES
        self.health = Health(_redact(url), backoff=float(backoff), max_backoff=float(max_backoff), on_event=on_event)
        # Redis key -> when Redis last answered "missing" or "rejected" for it. The cache looks a
        # key up twice on a cold miss and every 20 ms while another local process builds it;
        # remembering the answer for a moment saves those round trips, and counts and logs a
        # bad entry once per read rather than once per poll.
        self._absent: dict[str, float] = {}
        # Redis key -> SHA1 of a value read there and found damaged for every reader: the only
        # kind of value a write may replace (the script checks it is still that one).
        self._damaged: dict[str, str] = {}
        self._refreshed: dict[str, float] = {}
        self.leases = Leases(self._client, self.health, self.lease_key, expiry=self.lease, enabled=not read_only)
        if secret is None and urlsplit(url).scheme != "unix" and urlsplit(url).hostname not in _LOOPBACK:
            logger.warning(
                "codegen cache: remote entries at %s are not signed; anyone who can write to that Redis "
                "can make this process load code of their choosing. Set CODEGEN_CACHE_REMOTE_SECRET.",
                _redact(url),
            )

    def __repr__(self) -> str:
        return f"RedisTier({_redact(self.url)!r}, signed={self._secret is not None}, read_only={self.read_only})"

    @property
    def signed(self) -> bool:
        """Whether entries are signed and checked with a shared secret."""
        return self._secret is not None

    def redis_key(self, digest: str) -> str:
        """The Redis key of a cache key digest (the entry every host can load)."""
        return self.prefix + digest

    def library_key(self, digest: str) -> str:
        """The Redis key of the shared library of an llvm entry, for hosts of this one's platform."""
        return f"{self.prefix}lib:{library_platform()}:{digest}"

    def lease_key(self, digest: str) -> str:
        """The Redis key of a key's build lease."""
        return f"{self.prefix}lease:{digest}"

    def piece_key(self, sha256: str) -> str:
        """The Redis key of a piece of a large entry (named by its content)."""
        return f"{self.prefix}piece:{sha256}"

    # ---- reads ----------------------------------------------------------------------------

    def get(self, digest: str, *, library: bool = False) -> bytes | None:
        """The framed artifact for `digest` (the library of this platform where there is one), or None.

        library=True: an llvm build, whose library is asked for first (one round trip for a hit
        of the fast form); otherwise the library is asked for after an LLVM IR entry.
        """
        found = self.fetch(digest, library=library)
        return None if found is None else bytes(found.frame)

    def fetch(self, digest: str, *, library: bool = False) -> Opened | None:
        """As get(), without a copy: the checked frame as a read-only view, and that frame unframed.

        The remote hit's way (`_cache._tiers.RemoteTierView`): it decodes what was checked
        here without unframing it again, and copies the bytes for this host's disk off its path.
        """
        if self.health.reads.offline():
            self.health.event("remote_offline")
            return None
        if library:
            found = self._library(digest)
            if found is not None or self.health.reads.offline():  # a failed call: no second deadline
                return found
        found = self._read(self.redis_key(digest), count_miss=True)
        if found is None:
            return None
        if found.codec == "llvm-so":
            # A library where any host reads: loaded only from its platform's key; its IR is served.
            portable = _artifacts.portable(found.frame)
            return Opened(memoryview(portable).toreadonly(), "llvm-ir", unframe(portable, info=False, views=True))
        if found.codec == "llvm-ir" and not library:
            return self._library(digest) or found
        return found

    def _library(self, digest: str) -> Opened | None:
        if self.health.reads.offline():
            return None
        found = self._read(self.library_key(digest), count_miss=False)
        return found if found is not None and found.codec == "llvm-so" else None

    def forget(self, digest: str) -> None:
        """Look `digest` up for real next time (a waiter polls for another host's entry)."""
        self._absent.pop(self.redis_key(digest), None)
        self._absent.pop(self.library_key(digest), None)

    def _read(self, name: str, *, count_miss: bool) -> Opened | None:
        seen = self._absent.get(name)
        if seen is not None and time.monotonic() - seen < _ABSENT_SECONDS:
            return None
        try:
            value = self._client.get(name.encode(), self._read_limit)
        except RemoteValueTooLargeError as err:  # the server answered; one entry is too big for us
            self._rejected(name, Rejection("cap", f"it is {err.size} bytes, over this host's cap of "
                                                  f"{self._read_limit} (CODEGEN_CACHE_REMOTE_MAX_ENTRY + envelope)"))
            return None
        except ConfigError as err:
            self.health.misconfigured(err)
            return None
        except OSError as err:
            self.health.failed(self.health.reads, "get", err)
            return None
        self.health.back(self.health.reads)
        if value is None:
            if count_miss:
                self.health.event("remote_misses")
            self._remember(self._absent, name, time.monotonic())
            return None
        opened = open_value(name, value, self._secret)
        if isinstance(opened, Rejection):
            self._rejected(name, opened, value)
            return None
        if self._secret is not None:
            self.health.verified()
        if manifest(opened):
            return self._joined(name, opened, value)
        return opened  # views of `value`, which nothing changes: it is this call's own buffer

    def _joined(self, name: str, opened: Opened, value: bytearray) -> Opened | None:
        """The entry a checked manifest names, from its pieces; None (a miss) when one is missing or wrong."""
        pieces = pieces_of(opened, self.max_entry_bytes)
        try:
            whole = pieces if isinstance(pieces, Rejection) else join(
                pieces, lambda sha, size: self._client.get(self.piece_key(sha).encode(), size))
        except RemoteValueTooLargeError:
            whole = Rejection("damaged", "a piece is larger than its manifest says")
        except ConfigError as err:
            self.health.misconfigured(err)
            return None
        except OSError as err:
            self.health.failed(self.health.reads, "get", err)
            return None
        if whole is None:  # a piece expired or was evicted: the entry is damaged for every reader
            whole = Rejection("damaged", "a piece of it is missing")
        if isinstance(whole, Rejection):
            self._rejected(name, whole, value if whole.damaged else None)
            return None
        return whole

    # ---- writes ---------------------------------------------------------------------------

    def put(self, digest: str, blob: bytes, *, portable: bool = True) -> bool:
        """Store a framed artifact under `digest` where nothing valid is stored; True when this call stored it."""
        return self.push(digest, blob, portable=portable) == "stored"

    def push(self, digest: str, blob: bytes, *, portable: bool = True) -> str:
        """Store an entry: 'stored', 'kept' (a value is there: left alone), 'skipped' (never) or 'failed' (retry later).

        A library (llvm-so) goes under this platform's key, and with portable=True its LLVM IR
        under the key every host reads.
        """
        if len(blob) > self.max_entry_bytes:
            self.health.event("remote_skipped")
            logger.debug("codegen cache: not storing %s remotely: %d bytes is over the cap of %d",
                         digest[:16], len(blob), self.max_entry_bytes)
            return "skipped"
        if self.read_only:
            return "skipped"
        try:
            codec = read_meta(blob)[0]
        except ArtifactError:
            codec = ""  # stored as it is: a reader's frame check says what it is worth
        if codec != "llvm-so":
            return self._store(self.redis_key(digest), blob)
        outcome = self._store(self.library_key(digest), blob)
        if portable and self._store(self.redis_key(digest), _artifacts.portable(blob)) == "failed":
            return "failed"  # the IR is what every other host needs: worth another try
        return outcome

    def _store(self, name: str, blob: bytes) -> str:
        if self.health.writes.offline():
            self.health.event("remote_offline")
            return "failed"
        px = int(self.ttl * 1000)
        if len(blob) > self.piece_bytes:
            # The pieces first, the manifest last: a reader never finds a manifest before its pieces.
            blob, pieces = split(blob, self.piece_bytes)
            for sha, piece in pieces:
                key = self.piece_key(sha).encode()
                if self.health.attempt(self.health.writes, "put", lambda key=key, piece=piece: self._client.set(
                        key, piece, px or None, nx=True)) is FAILED:
                    return "failed"
        value = seal(name, blob, self._secret)
        damaged = self._damaged.pop(name, None)
        if damaged is None:
            stored = self.health.attempt(self.health.writes, "put",
                                         lambda: self._client.set(name.encode(), value, px or None, nx=True))
        else:
            stored = self.health.attempt(self.health.writes, "put", lambda: self._client.run(
                REPLACE, name.encode(), [damaged.encode(), value, b"%d" % px], _read_int) == 1)
        if stored is FAILED:
            return "failed"
        self._absent.pop(name, None)
        if not stored:
            self.health.event("remote_kept")
            return "kept"
        self.health.event("remote_stores")
        if damaged is not None:
            self.health.event("remote_replaced")
            logger.debug("codegen cache: replaced the damaged remote value of %s", name)
        return "stored"

    def refresh_due(self, digest: str) -> bool:
        """Whether a hit of `digest` should refresh its TTL now (once per interval per process); marks it done."""
        if not self.ttl or self.read_only:
            return False
        now = time.monotonic()
        if now - self._refreshed.get(digest, -1e18) < self.ttl / _REFRESH_FRACTION:
            return False
        self._remember(self._refreshed, digest, now)
        return True

    def refresh(self, digest: str, *, library: bool) -> None:
        """Extend the TTL of `digest`'s entry (and of its library) if an interval of it has passed."""
        ttl_ms, interval_ms = int(self.ttl * 1000), int(self.ttl * 1000 / _REFRESH_FRACTION)
        for name in (self.redis_key(digest), *([self.library_key(digest)] if library else [])):
            if self.health.writes.offline():
                return
            args = [b"%d" % ttl_ms, b"%d" % interval_ms]
            if self.health.attempt(self.health.writes, "refresh",
                                   lambda: self._client.run(REFRESH, name.encode(), args, _read_int)) == 1:
                self.health.event("remote_refreshed")

    def check(self) -> None:
        """One round trip to Redis (a GET of a key nobody writes), raising what it raised: `codegen-cache doctor`.

        OSError: not reached, or no answer within the timeout; ConfigError: the handshake was refused.
        """
        self._client.get(f"{self.prefix}doctor-check".encode(), 64)

    def connect_early(self) -> None:
        """Start connecting now, in the background, so that the first call finds a connection (see _client)."""
        if not self.health.reads.offline():
            self._client.connect_early()

    def close(self) -> None:
        """Close the connections to Redis."""
        try:
            self._client.close()
        except OSError as err:
            logger.debug("codegen cache: closing %s: %s", _redact(self.url), err)

    def _rejected(self, name: str, why: Rejection, value: bytes | bytearray | None = None) -> None:
        self._remember(self._absent, name, time.monotonic())
        if why.damaged and value is not None:
            self._remember(self._damaged, name, hashlib.sha1(value).hexdigest())  # noqa: S324 - Redis's sha1hex
        self.health.rejected(name, why, replaceable=why.damaged and value is not None)

    @staticmethod
    def _remember(memo: dict, key: str, value: object) -> None:
        if len(memo) >= _MEMO_ENTRIES:
            # Dict operations are atomic under the GIL; a racing reader at worst costs one extra call.
            for old in list(memo)[: _MEMO_ENTRIES // 2]:
                memo.pop(old, None)
        memo[key] = value


def _read_int(conn, command: str, deadline: float) -> int:
    return conn.expect_int(command, deadline)
