"""The remote tier's Redis client: a single server or a Redis Cluster behind one URL, one deadline per call.

Each call (GET, SET NX, a script) has one monotonic deadline for everything it does: taking or
opening a connection (TLS, AUTH, SELECT), reading the cluster's slot map, following redirects
and reading the reply. A URL names one node; the client sends every command there until a node
answers `-MOVED`: from then on it routes by key slot (`_cluster.SlotMap`), reads the map with
CLUSTER SLOTS from the node that redirected, follows `-MOVED` (remembered) and `-ASK` (not
remembered: every command of that call goes to the node named, each after its own ASKING), at
most MAX_REDIRECTS times per call. There are no retries: a node that fails ends the call, and
marks the map to be read again by the next one (a failover may have moved its slots).

Every failure is an OSError (`_resp`'s), or ConfigError for a setting a cluster cannot have (a
database other than 0). A few idle connections per node are kept for reuse (thread-safe); a
child made by fork opens its own. `connect_early` opens the first one on a thread of its own
(resolving the name, TLS, AUTH, SELECT), so that a fresh process's first call need not: that
call waits for it, within its own deadline, rather than open a second one.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from .._errors import ConfigError, RemoteRefusedError, RemoteReplyError
from .._forksafe import on_fork_child
from ._cluster import Redirect, SlotMap
from ._endpoint import Endpoint, left, show_address
from ._resp import Connection

__all__ = ["MAX_REDIRECTS", "RespClient", "Script"]

logger = logging.getLogger(__name__)

MAX_REDIRECTS = 5  # a slot migrating while the map is read again needs two or three
_KEEP_IDLE = 4  # per node
_SLOTS_REPLY_LIMIT = 8 << 20
_REFRESH_SECONDS = 1.0  # a stale map is read again at most this often

T = TypeVar("T")


@dataclass(frozen=True)
class Script:
    """A Lua script, sent by its SHA1 (EVALSHA) and in full when the server does not have it yet."""

    body: bytes
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.body).hexdigest())  # noqa: S324 - Redis names scripts so


class RespClient:
    """GET, SET and scripts against one Redis server or cluster; thread-safe."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.slots = SlotMap()
        self._idle: dict[tuple[str, int] | str, list[Connection]] = {}
        self._lock = threading.Lock()
        self._refreshed = 0.0
        self._early: threading.Event | None = None  # set once connect_early's connection is made (or failed)
        self._generation = 0  # close() ends it: a connection made early for an older one is closed, not kept
        on_fork_child(self._forget_parent)

    def connect_early(self) -> None:
        """Open a connection to the URL's node now, on a thread of its own, for the first call to take."""
        with self._lock:
            if self._early is not None or self._idle.get(self.endpoint.address):
                return
            early = self._early = threading.Event()
            generation = self._generation
        try:
            threading.Thread(target=self._open_early, args=(early, generation), name="codegen-cache-remote-connect",
                             daemon=True).start()
        except RuntimeError:  # no new threads (the interpreter is exiting): the first call connects
            early.set()

    def _open_early(self, early: threading.Event, generation: int) -> None:
        try:
            conn = Connection(self.endpoint, time.monotonic() + self.endpoint.timeout)
        except (OSError, ConfigError) as err:
            # Not counted: the first call connects itself, and reports what fails then.
            logger.debug("codegen cache: connecting early to %s: %s", show_address(self.endpoint.address), err)
        else:
            with self._lock:  # one hold: a close() now cannot miss this connection
                idle = self._idle.setdefault(self.endpoint.address, [])
                keep = generation == self._generation and len(idle) < _KEEP_IDLE
                if keep:
                    idle.append(conn)
            if not keep:
                conn.close()
        finally:
            early.set()

    # ---- commands ------------------------------------------------------------------------

    def get(self, key: bytes, limit: int) -> bytearray | None:
        """The value of `key`, None if it has none; RemoteValueTooLargeError past `limit` bytes."""
        def send(conn: Connection, deadline: float) -> bytearray | None:
            conn.call([b"GET", key], deadline)
            return conn.expect_bulk("GET", deadline, limit)

        return self._call(key, send)

    def set(self, key: bytes, value: bytes, px: int | None, *, nx: bool = False) -> bool:
        """SET `key` to `value`, expiring in `px` ms (None: never); with nx, only where absent. True when set."""
        args = [b"SET", key, value, *([b"PX", b"%d" % px] if px else []), *([b"NX"] if nx else [])]

        def send(conn: Connection, deadline: float) -> bool:
            conn.call(args, deadline)
            return conn.expect_ok("SET", deadline, nil=nx)

        return self._call(key, send)

    def run(self, script: Script, key: bytes, args: Sequence[bytes], read: Callable[[Connection, str, float], T]) -> T:
        """Run `script` on one key (EVALSHA; EVAL where the node does not have it); `read` reads its reply."""
        tail = [b"1", key, *args]

        def send(conn: Connection, deadline: float) -> T:
            conn.call([b"EVALSHA", script.sha.encode(), *tail], deadline)
            try:
                return read(conn, "EVALSHA", deadline)
            except RemoteRefusedError as err:
                if err.code != "NOSCRIPT":
                    raise
            conn.call([b"EVAL", script.body, *tail], deadline)  # loads it on that node, for next time
            return read(conn, "EVAL", deadline)

        return self._call(key, send)

    def close(self) -> None:
        """Close the idle connections (one in use closes when its call ends)."""
        with self._lock:
            idle, self._idle = self._idle, {}
            self._generation += 1
        for conns in idle.values():
            for conn in conns:
                conn.close()

    # ---- routing -------------------------------------------------------------------------

    def _call(self, key: bytes, send: Callable[[Connection, float], T]) -> T:
        deadline = time.monotonic() + self.endpoint.timeout
        seed = self.endpoint.address
        if self.slots.clustered and self.slots.stale and time.monotonic() - self._refreshed > _REFRESH_SECONDS:
            self._read_map(deadline, self.slots.nodes())
        address = self.slots.node_for(key, seed) if isinstance(seed, tuple) else seed
        asking = False
        for _redirect in range(MAX_REDIRECTS + 1):
            conn = self._take(address, deadline)
            conn.asking = asking
            try:
                result = send(conn, deadline)
            except Redirect as moved:
                conn.asking = False
                self._give(address, conn)  # an error reply: the connection is still in step
                # An empty host: the node did not know its address; it is the one we asked.
                target = (moved.address[0] or _host(address), moved.address[1])
                asking = moved.kind == "ASK"
                if not asking:
                    first = not self.slots.clustered
                    self.slots.moved(moved.slot, target)
                    if first:
                        self._read_map(deadline, [target])
                logger.debug("codegen cache: %s redirected %s to %s", show_address(address), moved, show_address(target))
                address = target
                continue
            except RemoteRefusedError:
                conn.asking = False
                self._give(address, conn)
                raise
            except BaseException:
                conn.close()
                if self.slots.clustered:
                    self.slots.stale = True  # a node failed: a failover may have moved its slots
                raise
            conn.asking = False
            self._give(address, conn)
            return result
        raise RemoteReplyError(f"more than {MAX_REDIRECTS} cluster redirects for one key")

    def _read_map(self, deadline: float, nodes: Sequence[tuple[str, int]]) -> None:
        """Read the slot map from the first of `nodes` that answers (the URL's node after them)."""
        self._refreshed = time.monotonic()
        seed = self.endpoint.address
        error: OSError | None = None
        for address in dict.fromkeys([*nodes, *([seed] if isinstance(seed, tuple) else [])]):
            try:
                conn = self._take(address, deadline)
            except OSError as err:
                error = err
                continue
            try:
                conn.call([b"CLUSTER", b"SLOTS"], deadline)
                reply = conn.expect_array("CLUSTER SLOTS", deadline, _SLOTS_REPLY_LIMIT)
                self.slots.load(reply, address)
            except RemoteRefusedError as err:
                # An ACL without +cluster|slots: go on with what the redirects teach, slot by slot.
                self._give(address, conn)
                logger.debug("codegen cache: CLUSTER SLOTS refused by %s (%s); following redirects",
                             show_address(address), err)
                self.slots.stale = False
                return
            except OSError as err:
                conn.close()
                error = err  # another node may answer, within the same deadline
                continue
            except BaseException:
                conn.close()
                raise
            self._give(address, conn)
            return
        if error is not None:
            raise error

    # ---- connections ---------------------------------------------------------------------

    def _take(self, address: tuple[str, int] | str, deadline: float) -> Connection:
        while True:
            with self._lock:
                idle = self._idle.get(address)
                conn = idle.pop() if idle else None
                early = self._early if address == self.endpoint.address else None
            if conn is None and early is not None and not early.is_set():
                early.wait(left(deadline))  # connect_early's connection is on its way, within this call's deadline
                continue
            if conn is None:
                endpoint = self.endpoint if address == self.endpoint.address else self.endpoint.at(address)
                return Connection(endpoint, deadline)
            if not conn.stale():
                return conn
            conn.close()

    def _give(self, address: tuple[str, int] | str, conn: Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if len(idle) < _KEEP_IDLE:
                idle.append(conn)
                return
        conn.close()

    def _forget_parent(self) -> None:
        # The parent's sockets are shared with it: never read or write them here, and do not
        # close them either (a TLS close could send a close_notify on the parent's session).
        self._lock = threading.Lock()
        self._idle = {}
        self._early = None  # the parent's thread does not run here


def _host(address: tuple[str, int] | str) -> str:
    return address[0] if isinstance(address, tuple) else ""
