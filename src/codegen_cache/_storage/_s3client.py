"""The object-store tier's client: obstore's S3Store, one request per call, its errors named as this package's.

Every call is one request: its timeout covers connecting, TLS and the whole body, and there are
no retries, so a call never outlives the tier's deadline. What obstore raises becomes `Missing`
(404), `Taken` (a create-only put that found the name taken: 412), `TooLarge` (an object whose
announced size is over the read's cap: not read), a RemoteRefusedError for a refused write
(403/401: writes stop, reads go on) or a RemoteReplyError for anything else (an OSError: the
tier's health takes calls offline). A ConfigError where the client cannot run: the `[s3]` extra
is missing, or this process is a child of fork whose parent started obstore's runtime.

The client is made on the first call, or on a thread of its own by `connect_early` (importing
obstore and opening a connection off the first lookup's path); making it does no I/O.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from .._config import AwsSettings
from .._errors import ConfigError, RemoteRefusedError, RemoteReplyError
from .._forksafe import on_fork_child, renew_after_fork

__all__ = ["Missing", "S3Client", "Taken", "TooLarge"]

logger = logging.getLogger(__name__)

_WRITES = ("PUT", "DELETE")


class Missing(Exception):
    """The object does not exist (404): a miss, not a failure."""


class Taken(Exception):
    """A create-only put found the name taken (412): another host stored it first."""


class TooLarge(RemoteReplyError):
    """An object announced as larger than the read's cap; not read (a failure where no cap was expected)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"an object of {size} bytes is over the cap (not read)")
        self.size = size

    def __reduce__(self):
        return (TooLarge, (self.size,))


class S3Client:
    """Reads, create-only writes, deletes and listings of one bucket; thread-safe, one request per call."""

    def __init__(self, url: str, bucket: str, aws: AwsSettings, timeout: float) -> None:
        self.url, self.bucket, self.aws, self.timeout = url, bucket, aws, timeout
        self._shared_as = (bucket, aws, timeout)  # which of the process's stores is this client's (_stores)
        self._store: Any = None  # a process that never calls imports nothing of obstore
        self._making = threading.Lock()  # one store per client: the first call waits for connect_early's
        on_fork_child(self._forget_parent)

    # ---- calls ------------------------------------------------------------------------------

    def read(self, name: str, limit: int) -> bytes:
        """The bytes of object `name`; Missing, or TooLarge when its announced size is over `limit`."""
        def get(obstore, store) -> bytes:
            result = obstore.get(store, name)
            size = int(result.meta["size"])
            if size > limit:
                raise TooLarge(size)
            data = result.bytes()
            if len(data) != size:
                raise RemoteReplyError(f"GET {name}: {len(data)} bytes read, {size} announced")
            return data.to_bytes()

        return self.request("GET", get)

    def read_if_any(self, name: str, limit: int) -> bytes | None:
        """The bytes of object `name`, None when there is none."""
        try:
            return self.read(name, limit)
        except Missing:
            return None

    def create(self, name: str, value: bytes) -> bool:
        """Create object `name` only where none is (If-None-Match: *); False when one is."""
        try:
            self.request("PUT", lambda obstore, store: obstore.put(store, name, value, mode="create"))
        except Taken:
            return False
        return True

    def overwrite(self, name: str, value: bytes) -> None:
        """Write object `name` whatever is there (a lease's renewal only: entries are create-only)."""
        self.request("PUT", lambda obstore, store: obstore.put(store, name, value))

    def delete(self, name: str) -> None:
        """Delete object `name` (nothing where there is none)."""
        try:
            self.request("DELETE", lambda obstore, store: obstore.delete(store, name))
        except Missing:
            pass

    def list(self, prefix: str) -> Iterator[dict]:
        """Every object under `prefix`: name, size, last_modified."""
        pages = self.request("LIST", lambda obstore, store: list(obstore.list(store, prefix, chunk_size=1000)))
        for page in pages:
            yield from ({"name": o["path"], "size": o["size"], "last_modified": o["last_modified"]} for o in page)

    def request(self, op: str, call: Callable[[Any, Any], Any]) -> Any:
        """call(obstore, store), with obstore's errors as this package's (the module's docstring)."""
        try:
            import obstore
            from obstore import exceptions as obs
        except ImportError as err:  # the [s3] extra is not installed: a configuration problem
            raise ConfigError("remote (CODEGEN_CACHE_REMOTE)", self.url,
                              "an installed S3 client: pip install 'tvm-codegen-cache[s3]'") from err
        _check_runtime(self.url)
        try:
            return call(obstore, self._made())
        except TooLarge:
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

    # ---- the store -------------------------------------------------------------------------

    def connect_early(self, probe: str) -> None:
        """Import obstore, make the store and open a connection (a GET of `probe`) on a thread of its own.

        Nothing to do where this process has the store already: an earlier client made it and
        keeps its connections."""
        if self._shared_as in _stores:
            return
        try:
            threading.Thread(target=self._open_early, args=(probe,), name="codegen-cache-s3-connect",
                             daemon=True).start()
        except RuntimeError:  # no new threads (the interpreter is exiting): the first call does it
            pass

    def _open_early(self, probe: str) -> None:
        # Not counted and not warned about: the first call reports what fails then.
        try:
            self.read_if_any(probe, 64)
        except (OSError, ConfigError) as err:
            logger.debug("codegen cache: connecting early to %s: %s", self.url, err)

    def close(self) -> None:
        """Drop this client's store (the process keeps it, with its idle connections, for the next client)."""
        with self._making:
            self._store = None

    def _made(self) -> Any:
        # Making the store does no I/O (it connects on its first request), so waiting here for
        # connect_early's thread never waits for the server.
        with self._making:
            if self._store is None:
                self._store = _shared_store(self._shared_as)
            return self._store

    def _forget_parent(self) -> None:
        # A child made by fork makes its own store (where it may: _check_runtime).
        self._making = threading.Lock()
        self._store = None


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


# One store per bucket, settings and timeout in a process. Making one costs ~7 ms of CPU with
# the GIL held (obstore reads the TLS roots), and connect_early makes it beside the caller's first
# lookups: a new CodegenCache on the same remote (a harness's, a test's) would make the caller's
# hits wait for it again (docs/benchmarks.md, "remote"). A store is thread-safe; a child of fork
# starts with none (its parent's belongs to a runtime the child does not have).
_stores: dict[tuple[str, AwsSettings, float], Any] = {}
_stores_lock = threading.Lock()
on_fork_child(lambda: _stores.clear())
renew_after_fork(globals(), "_stores_lock")


def _shared_store(key: tuple[str, AwsSettings, float]) -> Any:
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = _make_store(*key)
        return store


def _make_store(bucket: str, aws: AwsSettings, timeout: float) -> Any:
    from obstore.store import S3Store

    config: dict[str, Any] = {"conditional_put": "etag"}  # create-only puts: If-None-Match: *
    for key, value in (("endpoint", aws.endpoint), ("region", aws.region), ("access_key_id", aws.access_key_id),
                       ("secret_access_key", aws.secret_access_key), ("token", aws.session_token)):
        if value:
            config[key] = value
    deadline = timedelta(seconds=timeout)
    client = {"timeout": deadline, "connect_timeout": deadline, "allow_http": (aws.endpoint or "").startswith("http:")}
    retry = {"max_retries": 0, "retry_timeout": deadline,
             "backoff": {"init_backoff": deadline, "max_backoff": deadline, "base": 2}}
    return S3Store(bucket, config=config, client_options=client, retry_config=retry)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]
