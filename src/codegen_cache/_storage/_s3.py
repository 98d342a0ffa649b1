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

The client is obstore (Rust's object_store): chosen over boto3 by measurement (its import, a
small GET, create-only puts; the commit that added this tier has the figures).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

from .. import _artifacts
from .._artifacts import FORMAT_VERSION, read_meta, unframe
from .._config import AwsSettings, Settings, aws_settings, check_remote_url, split_remote_urls
from .._errors import ArtifactError, ConfigError, RemoteRefusedError, RemoteReplyError
from .._forksafe import on_fork_child
from ._envelope import ENVELOPE_BYTES, Opened, Rejection, open_value, seal
from ._health import FAILED, Health
from ._objleases import ObjectLeases
from ._pieces import join, manifest, pieces_of, split
from ._platform import library_platform

__all__ = ["S3Tier"]

logger = logging.getLogger(__name__)

_DEFAULTS = {field.name: field.default for field in dataclasses.fields(Settings)}
_ABSENT_SECONDS = 1.0  # as the Redis tier: a cold miss looks a key up twice, a waiter polls
_MEMO_ENTRIES = 4096
_WRITES = ("PUT", "DELETE")
# An entry larger than this is stored in pieces (`_pieces`): each one PUT, far below S3's limit
# of 5 GiB for a single PUT, and each GET bounded by the call's deadline.
PIECE_BYTES = 64 << 20

EventSink = Callable[..., None]


class Missing(Exception):
    """The object does not exist (404): a miss, not a failure."""


class Taken(Exception):
    """A create-only put found the name taken (412): another host stored it first."""


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
        self._s3: Any = None  # made on the first call or by connect_early: a process without a remote imports nothing
        self._making = threading.Lock()  # one client per tier: the first call waits for connect_early's
        on_fork_child(self._forget_parent)
        self.health = Health(self.url, backoff=float(backoff), max_backoff=float(max_backoff), on_event=on_event)
        self._absent: dict[str, float] = {}
        self.leases = ObjectLeases(self, self.health, self.lease_key, expiry=float(lease), enabled=not self.read_only)
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

    # ---- the client: one request per call, its errors named ---------------------------------

    def _client(self) -> Any:
        # Making the client does no I/O (it connects on its first request), so waiting here for
        # connect_early's thread never waits for the server.
        with self._making:
            if self._s3 is None:
                self._s3 = _make_store(self.bucket, self.aws, self.timeout)
            return self._s3

    def request(self, op: str, call: Callable[[Any, Any], Any]) -> Any:
        """call(obstore, store) with obstore's errors as this package's: Missing, Taken, or an OSError.

        A refused write (403, 401) is a RemoteRefusedError, which stops writes alone
        (`Health.failed`); a refused read stops every call, as an outage does.
        """
        try:
            import obstore
            from obstore import exceptions as obs
        except ImportError as err:  # the [s3] extra is not installed: a configuration problem
            raise ConfigError("remote (CODEGEN_CACHE_REMOTE)", self.url,
                              "an installed S3 client: pip install 'tvm-codegen-cache[s3]'") from err
        _check_runtime(self.url)
        try:
            return call(obstore, self._client())
        except _TooLarge:
            raise
        # obstore raises some of its errors as the builtin OSErrors they mean (a 404 is a
        # FileNotFoundError): those are named here before any other OSError.
        except (obs.NotFoundError, FileNotFoundError):
            raise Missing from None
        except (obs.AlreadyExistsError, obs.PreconditionError, FileExistsError):
            raise Taken from None
        except (obs.PermissionDeniedError, obs.UnauthenticatedError, PermissionError) as err:
            if op in _WRITES:  # credentials that may read and not write: writes stop, reads go on
                raise RemoteRefusedError(op, f"ACCESSDENIED {_first_line(err)}") from None
            raise RemoteReplyError(f"{op} refused: {_first_line(err)}") from None  # may not read: nothing works
        except (obs.BaseError, OSError) as err:
            raise RemoteReplyError(f"{op}: {_first_line(err)}") from None

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

    def read_object(self, name: str, limit: int) -> bytes:
        """The bytes of object `name`; Missing, or RemoteReplyError when its announced size is over `limit`."""
        def get(obstore, store) -> bytes:
            result = obstore.get(store, name)
            size = int(result.meta["size"])
            if size > limit:
                raise _TooLarge(size)
            data = result.bytes()
            if len(data) != size:
                raise RemoteReplyError(f"GET {name}: {len(data)} bytes read, {size} announced")
            return data.to_bytes()

        return self.request("GET", get)

    def read_if_any(self, name: str, limit: int) -> bytes | None:
        """The bytes of object `name`, None when there is none; OSError when the call failed."""
        try:
            return self.read_object(name, limit)
        except Missing:
            return None

    def delete(self, name: str) -> None:
        """Delete object `name` (nothing where there is none); OSError when the call failed."""
        try:
            self.request("DELETE", lambda obstore, store: obstore.delete(store, name))
        except Missing:
            pass

    def overwrite(self, name: str, value: bytes) -> None:
        """Write object `name` whatever is there (a lease's renewal only: entries are create-only)."""
        self.request("PUT", lambda obstore, store: obstore.put(store, name, value))

    def _read(self, name: str, *, count_miss: bool) -> Opened | None:
        seen = self._absent.get(name)
        if seen is not None and time.monotonic() - seen < _ABSENT_SECONDS:
            return None
        try:
            value = self.read_object(name, self._read_limit)
        except Missing:
            self.health.back(self.health.reads)
            if count_miss:
                self.health.event("remote_misses")
            self._remember(name)
            return None
        except _TooLarge as err:  # the server answered; one object is too big for us
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
            # Left in place even when damaged for every reader: create-only puts cannot replace
            # it, and `prune` (or the bucket's lifecycle rule) removes it.
            self._remember(name)
            self.health.rejected(name, opened, replaceable=False)
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
                pieces, lambda sha, size: self.read_if_any(self.piece_name(sha), size))
        except _TooLarge:
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
            self._remember(name)
            self.health.rejected(name, whole, replaceable=False)
            if whole.damaged and not self.read_only and not self.health.writes.offline():
                # A manifest whose pieces are gone (expired by a lifecycle rule) serves nobody, and
                # create-only puts could never replace it: removed, so the next store writes it anew.
                self.health.attempt(self.health.writes, "delete", lambda: self.delete(name))
            return None
        return whole

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

    def create(self, name: str, value: bytes) -> bool:
        """Create object `name` only where none is (If-None-Match: *); False when one is. OSError when it failed."""
        try:
            self.request("PUT", lambda obstore, store: obstore.put(store, name, value, mode="create"))
        except Taken:
            return False
        return True

    def _store(self, name: str, blob: bytes) -> str:
        if self.health.writes.offline():
            self.health.event("remote_offline")
            return "failed"
        if len(blob) > self.piece_bytes:
            # The pieces first, the manifest last: a reader never finds a manifest before its pieces.
            blob, pieces = split(blob, self.piece_bytes)
            for sha, piece in pieces:
                if self.health.attempt(self.health.writes, "put", lambda sha=sha, piece=piece: self.create(
                        self.piece_name(sha), bytes(piece))) is FAILED:
                    return "failed"
        value = seal(name, blob, self._secret)
        stored = self.health.attempt(self.health.writes, "put", lambda: self.create(name, value))
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
        def pages(obstore, store):
            return list(obstore.list(store, self.prefix, chunk_size=1000))

        for page in self.request("LIST", pages):
            yield from ({"name": o["path"], "size": o["size"], "last_modified": o["last_modified"]} for o in page)

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
                self.delete(obj["name"])
            count += 1
            size += int(obj["size"])
        return count, size

    def check(self) -> None:
        """One round trip (a GET of a name nobody writes), raising what it raised: `codegen-cache doctor`."""
        try:
            self.read_object(f"{self.prefix}doctor-check", 64)
        except Missing:
            return

    def connect_early(self) -> None:
        """Import the client, make it and open a connection now, on a thread of its own, for the first call to use."""
        try:
            threading.Thread(target=self._open_early, name="codegen-cache-s3-connect", daemon=True).start()
        except RuntimeError:  # no new threads (the interpreter is exiting): the first call does it
            pass

    def _forget_parent(self) -> None:
        # A child made by fork makes its own client: the parent's holds its connections and the
        # state of threads that do not run here.
        self._making = threading.Lock()
        self._s3 = None

    def _open_early(self) -> None:
        # Not counted and not warned about: the first call reports what fails then.
        try:
            self.read_object(f"{self.prefix}doctor-check", 64)
        except (Missing, OSError, ConfigError) as err:
            logger.debug("codegen cache: connecting early to %s: %s", self.url, err)

    def close(self) -> None:
        """Drop the client (its connections close with it)."""
        with self._making:
            self._s3 = None

    def _remember(self, name: str) -> None:
        if len(self._absent) >= _MEMO_ENTRIES:
            for old in list(self._absent)[: _MEMO_ENTRIES // 2]:
                self._absent.pop(old, None)
        self._absent[name] = time.monotonic()


class _TooLarge(RemoteReplyError):
    """An object announced as larger than the read's cap; not read (a failure where no cap was expected)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"an object of {size} bytes is over the cap (not read)")
        self.size = size

    def __reduce__(self):
        return (_TooLarge, (self.size,))


# The pid of the process whose calls started obstore's runtime (one per process, Rust's tokio):
# its threads do not exist in a child made by fork, where a request would wait for ever.
_runtime_pid: list[int] = []


def _check_runtime(url: str) -> None:
    """ConfigError in a child of fork whose parent started obstore's runtime: the tier is off there, nothing hangs."""
    pid = os.getpid()
    if not _runtime_pid:
        _runtime_pid.append(pid)
    elif _runtime_pid[0] != pid:
        raise ConfigError("remote (CODEGEN_CACHE_REMOTE)", url,
                          "a process that did not inherit the S3 client by fork: obstore's runtime does not survive "
                          "fork, so this child of a process that used it works local-only; start pool workers "
                          "with the spawn or forkserver method to give them the S3 tier")


def _make_store(bucket: str, aws: AwsSettings, timeout: float) -> Any:
    from obstore.store import S3Store

    config: dict[str, Any] = {"conditional_put": "etag"}  # create-only puts: If-None-Match: *
    for key, value in (("endpoint", aws.endpoint), ("region", aws.region), ("access_key_id", aws.access_key_id),
                       ("secret_access_key", aws.secret_access_key), ("token", aws.session_token)):
        if value:
            config[key] = value
    deadline = timedelta(seconds=timeout)
    # One request per call: its timeout covers connecting and the whole body; no retries, so a
    # call never outlives it.
    client = {"timeout": deadline, "connect_timeout": deadline, "allow_http": (aws.endpoint or "").startswith("http:")}
    retry = {"max_retries": 0, "retry_timeout": deadline,
             "backoff": {"init_backoff": deadline, "max_backoff": deadline, "base": 2}}
    return S3Store(bucket, config=config, client_options=client, retry_config=retry)


def _is_loopback(endpoint: str | None) -> bool:
    host = urlsplit(endpoint).hostname if endpoint else None
    return host in ("localhost", "127.0.0.1", "::1")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]
