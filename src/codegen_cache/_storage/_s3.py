"""A shared remote tier on an object store speaking the S3 API, with the same guarantees as the Redis tier.

Objects, under `[PREFIX/]codegen-cache/v<format>/` in the bucket (readers of another layout
never see them):
    <digest>                  the entry in a form every host can load (for llvm: its LLVM IR)
    lib/<platform>/<digest>   an llvm entry linked into a shared library, for hosts of that platform
    lease/<digest>            the build lease of a key (`_objleases`)
    piece/<sha256>            a piece of an entry larger than `piece_bytes` (`_pieces`)

Each value is the Redis tier's signed envelope around the framed artifact (`_envelope`), signed
for its object's name. Entries are never overwritten: a put is create-only (`If-None-Match: *`),
and a put that finds the name taken (412) is a lost race, counted `remote_kept`: that object is
the entry. A value is read only if the size the server announces is within the cap, and its
envelope, signature and frame are checked before anything of it is decoded.

Every call is one request with one deadline (`timeout`: connecting, TLS and the whole body),
and no retries. A failed call is a miss or a skipped write, counted, and takes its kind of call
offline for a backoff (`_health`): a refused write (403 from read-only credentials) stops writes
while reads go on; a refused read, no answer or a malformed one stops both. There is no TTL on an
object: the bucket is bounded by a lifecycle rule by age or by `prune` (docs/remote.md).

The client (`_s3client`) is obstore (Rust's object_store): chosen over boto3 by measurement
(its import, a small GET, create-only puts; docs/remote.md has the figures).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from urllib.parse import urlsplit

from .. import _artifacts
from .._artifacts import FORMAT_VERSION, read_meta, unframe
from .._config import AwsSettings, Settings, aws_settings, check_remote_url, split_remote_urls
from .._errors import ArtifactError, ConfigError
from ._envelope import ENVELOPE_BYTES, Opened, Rejection, open_value, seal
from ._health import FAILED, Health
from ._objleases import ObjectLeases
from ._pieces import join, manifest, pieces_of, split
from ._platform import library_platform
from ._s3client import Missing, S3Client, TooLarge

__all__ = ["S3Tier"]

logger = logging.getLogger(__name__)

_DEFAULTS = {field.name: field.default for field in dataclasses.fields(Settings)}
_ABSENT_SECONDS = 1.0  # as the Redis tier: a cold miss looks a key up twice, a waiter polls
_MEMO_ENTRIES = 4096
# An entry larger than this is stored in pieces (`_pieces`): each one PUT, far below S3's limit
# of 5 GiB for a single PUT, and each GET bounded by the call's deadline.
PIECE_BYTES = 64 << 20

EventSink = Callable[..., None]


class S3Tier:
    """The remote tier on a bucket: get/fetch(digest) -> framed bytes or None, put/push(digest, frame), leases."""

    def __init__(
        self,
        url: str,
        *,
        secret: str | bytes | None = None,
        on_event: EventSink | None = None,
        max_entry_bytes: int = _DEFAULTS["remote_max_entry_bytes"],
        ttl: float = _DEFAULTS["remote_ttl"],
        timeout: float = _DEFAULTS["remote_timeout"],
        backoff: float = 5.0,
        max_backoff: float = 300.0,
        prefix: str = "codegen-cache",
        read_only: bool = False,
        lease: float = _DEFAULTS["remote_lease"],
        aws: AwsSettings | None = None,
        piece_bytes: int = PIECE_BYTES,
    ) -> None:
        self.url = check_remote_url(url)
        parts = urlsplit(self.url)
        if parts.scheme != "s3" or len(split_remote_urls(self.url)) > 1:
            raise ConfigError("remote (CODEGEN_CACHE_REMOTE)", url, "an s3://BUCKET[/PREFIX] URL")
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
        if not isinstance(piece_bytes, int) or isinstance(piece_bytes, bool) or piece_bytes <= 0:
            raise ConfigError("piece_bytes", piece_bytes, "a whole number of bytes, 1 or more")
        self._secret = secret
        self.max_entry_bytes = max_entry_bytes
        self.piece_bytes = piece_bytes
        self.ttl = float(ttl)
        self.timeout = float(timeout)
        self.read_only = bool(read_only)
        self.bucket = parts.hostname or ""
        # The format version is in the prefix: readers of another layout never see these objects.
        self.prefix = "/".join(p for p in (parts.path.strip("/"), prefix, f"v{FORMAT_VERSION}") if p) + "/"
        self._read_limit = max_entry_bytes + ENVELOPE_BYTES
        self.aws = aws_settings() if aws is None else aws
        self.client = S3Client(self.url, self.bucket, self.aws, self.timeout)
        self.health = Health(self.url, backoff=float(backoff), max_backoff=float(max_backoff), on_event=on_event)
        self._absent: dict[str, float] = {}
        self.leases = ObjectLeases(self.client, self.health, self.lease_key, expiry=float(lease), enabled=not self.read_only)
        if secret is None and not _is_loopback(self.aws.endpoint):
            logger.warning(
                "codegen cache: remote entries in %s are not signed; anyone who can write to that bucket can "
                "make this process load code of their choosing. Set CODEGEN_CACHE_REMOTE_SECRET.", self.url)

    def __repr__(self) -> str:
        return f"S3Tier({self.url!r}, signed={self._secret is not None}, read_only={self.read_only})"

    @property
    def signed(self) -> bool:
        """Whether entries are signed and checked with a shared secret."""
        return self._secret is not None

    def object_name(self, digest: str) -> str:
        """The object name of a cache key digest (the entry every host can load)."""
        return self.prefix + digest

    def library_name(self, digest: str) -> str:
        """The object name of the shared library of an llvm entry, for hosts of this one's platform."""
        return f"{self.prefix}lib/{library_platform()}/{digest}"

    def lease_key(self, digest: str) -> str:
        """The object name of a key's build lease."""
        return f"{self.prefix}lease/{digest}"

    def piece_name(self, sha256: str) -> str:
        """The object name of a piece of a large entry (named by its content)."""
        return f"{self.prefix}piece/{sha256}"

    # ---- reads ----------------------------------------------------------------------------

    def get(self, digest: str, *, library: bool = False) -> bytes | None:
        """The framed artifact for `digest` (the library of this platform where there is one), or None."""
        found = self.fetch(digest, library=library)
        return None if found is None else bytes(found.frame)

    def fetch(self, digest: str, *, library: bool = False) -> Opened | None:
        """As get(), without a copy: the checked frame as a read-only view, and that frame unframed."""
        if self.health.reads.offline():
            self.health.event("remote_offline")
            return None
        if library:
            found = self._library(digest)
            if found is not None or self.health.reads.offline():  # a failed call: no second deadline
                return found
        found = self._read(self.object_name(digest), count_miss=True)
        if found is None:
            return None
        if found.codec == "llvm-so":
            portable = _artifacts.portable(found.frame)
            return Opened(memoryview(portable).toreadonly(), "llvm-ir", unframe(portable, info=False, views=True))
        if found.codec == "llvm-ir" and not library:
            return self._library(digest) or found
        return found

    def _library(self, digest: str) -> Opened | None:
        if self.health.reads.offline():
            return None
        found = self._read(self.library_name(digest), count_miss=False)
        return found if found is not None and found.codec == "llvm-so" else None

    def forget(self, digest: str) -> None:
        """Look `digest` up for real next time (a waiter polls for another host's entry)."""
        self._absent.pop(self.object_name(digest), None)
        self._absent.pop(self.library_name(digest), None)

    def _read(self, name: str, *, count_miss: bool) -> Opened | None:
        seen = self._absent.get(name)
        if seen is not None and time.monotonic() - seen < _ABSENT_SECONDS:
            return None
        try:
            value = self.client.read(name, self._read_limit)
        except Missing:
            self.health.back(self.health.reads)
            if count_miss:
                self.health.event("remote_misses")
            self._remember(name)
            return None
        except TooLarge as err:  # the server answered; one object is too big for us
            self._remember(name)
            self.health.rejected(name, Rejection("cap", f"it is {err.size} bytes, over this host's cap of "
                                                        f"{self._read_limit} (CODEGEN_CACHE_REMOTE_MAX_ENTRY + "
                                                        "envelope)"), replaceable=False)
            return None
        except ConfigError as err:
            self.health.misconfigured(err)
            return None
        except OSError as err:
            self.health.failed(self.health.reads, "get", err)
            return None
        self.health.back(self.health.reads)
        opened = open_value(name, value, self._secret)
        if isinstance(opened, Rejection):
            self._unusable(name, opened)
            return None
        if self._secret is not None:
            self.health.verified()
        if manifest(opened):
            return self._joined(name, opened)
        return opened

    def _joined(self, name: str, opened: Opened) -> Opened | None:
        """The entry a checked manifest names, from its pieces; None (a miss) when one is missing or wrong."""
        pieces = pieces_of(opened, self.max_entry_bytes)
        try:
            whole = pieces if isinstance(pieces, Rejection) else join(
                pieces, lambda sha, size: self.client.read_if_any(self.piece_name(sha), size))
        except TooLarge:
            whole = Rejection("damaged", "a piece is larger than its manifest says")
        except ConfigError as err:
            self.health.misconfigured(err)
            return None
        except OSError as err:
            self.health.failed(self.health.reads, "get", err)
            return None
        if whole is None:
            whole = Rejection("damaged", "a piece of it is missing")
        if isinstance(whole, Rejection):
            self._unusable(name, whole)
            return None
        return whole

    def _unusable(self, name: str, why: Rejection) -> None:
        """An object not loaded: counted and said once; one damaged for every reader is removed.

        Damaged for every reader (no envelope, a bad frame, a manifest whose pieces are gone):
        it serves nobody, and create-only puts could never replace it, so it is deleted and the
        next store writes the entry anew (the Redis tier replaces such a value). An object that
        is only unusable here (another secret's, a newer envelope, over this host's cap) stays.
        An object is never seen half-written (a PUT is atomic), so a damaged one is not a write
        in progress.
        """
        self._remember(name)
        fixable = why.damaged and not self.read_only and not self.health.writes.offline()
        self.health.rejected(name, why, replaceable=fixable)
        if fixable:
            self.health.attempt(self.health.writes, "delete", lambda: self.client.delete(name))

    # ---- writes ---------------------------------------------------------------------------

    def put(self, digest: str, blob: bytes, *, portable: bool = True) -> bool:
        """Store a framed artifact under `digest` where no object is; True when this call stored it."""
        return self.push(digest, blob, portable=portable) == "stored"

    def push(self, digest: str, blob: bytes, *, portable: bool = True) -> str:
        """Store an entry: 'stored', 'kept' (an object is there: left alone), 'skipped' (never) or 'failed'."""
        if len(blob) > self.max_entry_bytes:
            self.health.event("remote_skipped")
            return "skipped"
        if self.read_only:
            return "skipped"
        try:
            codec = read_meta(blob)[0]
        except ArtifactError:
            codec = ""
        if codec != "llvm-so":
            return self._store(self.object_name(digest), blob)
        outcome = self._store(self.library_name(digest), blob)
        if portable and self._store(self.object_name(digest), _artifacts.portable(blob)) == "failed":
            return "failed"
        return outcome

    def _store(self, name: str, blob: bytes) -> str:
        if self.health.writes.offline():
            self.health.event("remote_offline")
            return "failed"
        if len(blob) > self.piece_bytes:
            # The pieces first, the manifest last: a reader never finds a manifest before its pieces.
            blob, pieces = split(blob, self.piece_bytes)
            for sha, piece in pieces:
                if self.health.attempt(self.health.writes, "put", lambda sha=sha, piece=piece: self.client.create(
                        self.piece_name(sha), bytes(piece))) is FAILED:
                    return "failed"
        value = seal(name, blob, self._secret)
        stored = self.health.attempt(self.health.writes, "put", lambda: self.client.create(name, value))
        if stored is FAILED:
            return "failed"
        self._absent.pop(name, None)
        if not stored:
            self.health.event("remote_kept")
            return "kept"
        self.health.event("remote_stores")
        return "stored"

    def refresh_due(self, digest: str) -> bool:
        """Never: an object has no TTL to extend (a lifecycle rule or `prune` bounds the bucket by age)."""
        return False

    def refresh(self, digest: str, *, library: bool) -> None:
        """Nothing to do (see refresh_due)."""

    # ---- the bucket as a whole -------------------------------------------------------------

    def objects(self) -> Iterator[dict]:
        """Every object of this tier (name, size, last_modified), in pages; OSError when listing fails."""
        return self.client.list(self.prefix)

    def prune(self, older_than: float, *, dry_run: bool = False) -> tuple[int, int]:
        """Delete entries written more than `older_than` seconds ago; (objects, bytes) deleted (or that would be).

        Expired leases go too. What a lifecycle rule by age does, for a bucket that has none.
        """
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=older_than)
        count = size = 0
        for obj in self.objects():
            if obj["last_modified"] >= cutoff:
                continue
            if not dry_run:
                self.client.delete(obj["name"])
            count += 1
            size += int(obj["size"])
        return count, size

    def check(self) -> None:
        """One round trip (a GET of a name nobody writes), raising what it raised: `codegen-cache doctor`."""
        self.client.read_if_any(f"{self.prefix}doctor-check", 64)

    def connect_early(self) -> None:
        """Import the client, make it and open a connection now, on a thread of its own, for the first call to use."""
        if not self.health.reads.offline():
            self.client.connect_early(f"{self.prefix}doctor-check")

    def close(self) -> None:
        """Drop the client (its connections close with it)."""
        self.client.close()

    def _remember(self, name: str) -> None:
        if len(self._absent) >= _MEMO_ENTRIES:
            for old in list(self._absent)[: _MEMO_ENTRIES // 2]:
                self._absent.pop(old, None)
        self._absent[name] = time.monotonic()



def _is_loopback(endpoint: str | None) -> bool:
    host = urlsplit(endpoint).hostname if endpoint else None
    return host in ("localhost", "127.0.0.1", "::1")
