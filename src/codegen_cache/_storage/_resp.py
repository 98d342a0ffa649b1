"""A small Redis client (RESP2 over a plain or TLS socket) with one deadline per call.

The remote tier needs three commands (AUTH and SELECT on connect, then GET or SET), and needs
them to fail in a bounded way whatever the server does. So this client:

- gives each call one monotonic deadline, shared by connecting, the TLS handshake, AUTH,
  SELECT, sending and every read: a server that trickles its reply a byte at a time ends the
  call at the deadline, where a per-read socket timeout would let it run on for ever;
- parses replies strictly: each command accepts exactly the reply types Redis sends for it
  (`+OK`, a bulk string or nil), with length-capped lines and exact length syntax; anything
  else, an error reply included, raises RemoteReplyError;
- checks a bulk string's announced length against the caller's cap before reading a byte
  of it, so a planted huge value costs no memory;
- drops a connection after any failure (its stream may hold half a reply) and reconnects on
  the next call; an idle connection the server closed, or one with unrequested bytes waiting,
  is replaced before use.

Every failure is an OSError: socket errors, TimeoutError at the deadline, ssl.SSLError, and
RemoteReplyError (a ConnectionError) for the server's protocol faults.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from .._errors import RemoteReplyError, RemoteValueTooLargeError
from .._forksafe import on_fork_child

__all__ = ["Endpoint", "RespClient"]

_MAX_LINE = 4096  # a status, error or length line; Redis's are far shorter
_LENGTH = re.compile(rb"-1|0|[1-9][0-9]{0,17}")
_CHUNK = 1 << 18
_KEEP_IDLE = 4
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect: address, credentials, database, TLS context, per-call deadline."""

    address: tuple[str, int] | str  # (host, port), or a unix socket path
    username: str | None
    password: str | None = field(repr=False)  # never in a log or a traceback
    db: int
    tls: ssl.SSLContext | None
    timeout: float

    @classmethod
    def from_url(cls, url: str, timeout: float) -> Endpoint:
        """The endpoint of a URL that `_config.check_remote_url` accepted; ValueError if its TLS files do not load."""
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        db = int(query.get("db", parts.path.strip("/") if parts.scheme != "unix" else "") or 0)
        timeout = float(query.get("timeout", query.get("socket_timeout", timeout)))
        if parts.scheme == "unix":
            address: tuple[str, int] | str = unquote(parts.path)
        else:
            address = (parts.hostname or "", parts.port or 6379)
        tls = _tls_context(query) if parts.scheme == "rediss" else None
        # As redis-py reads them: an empty user or password is none.
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        return cls(address, username, password, db, tls, timeout)


def _tls_context(options: dict[str, str]) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"), capath=options.get("ssl_ca_path"))
        if "ssl_certfile" in options:
            context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    except (OSError, ssl.SSLError) as err:
        raise ValueError(f"cannot load the TLS certificates: {err}") from None
    verify = _CERT_REQS[options.get("ssl_cert_reqs", "required").lower()]
    context.check_hostname = options.get("ssl_check_hostname", "true").lower() in _TRUE and verify != ssl.CERT_NONE
    context.verify_mode = verify
    return context


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the remote call ran past its deadline")
    return left


def _connect(address: tuple[str, int] | str, deadline: float) -> socket.socket:
    """A connected socket; every address of the host is tried within the one deadline."""
    if isinstance(address, str):
        targets = [(socket.AF_UNIX, socket.SOCK_STREAM, 0, "", address)]
    else:
        # Name resolution is the system resolver's, with its own timeouts; a numeric host has none.
        try:
            targets = socket.getaddrinfo(*address, type=socket.SOCK_STREAM)
        except UnicodeError as err:  # a host name IDNA cannot encode ("a..b")
            raise OSError(f"cannot resolve {address[0]!r}: {err}") from None
    error: OSError = OSError(f"no address for {address!r}")
    for family, kind, proto, _name, target in targets:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(target)
        except OSError as err:
            sock.close()
            error = err
            continue
        except BaseException:
            sock.close()
            raise
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise error


class _Connection:
    """One socket to the server; every method takes the call's deadline."""

    def __init__(self, endpoint: Endpoint, deadline: float) -> None:
        self._buf = bytearray()
        self._sock = sock = _connect(endpoint.address, deadline)
        try:
            if endpoint.tls is not None:
                sock.settimeout(_left(deadline))  # CPython bounds the whole handshake by it
                host = endpoint.address[0] if isinstance(endpoint.address, tuple) else None
                self._sock = endpoint.tls.wrap_socket(sock, server_hostname=host)
            if endpoint.password is not None:
                user = [endpoint.username] if endpoint.username else []
                self.call(["AUTH", *user, endpoint.password], deadline)
                self.expect_ok("AUTH", deadline)
            if endpoint.db:
                self.call(["SELECT", str(endpoint.db)], deadline)
                self.expect_ok("SELECT", deadline)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._sock.close()

    def stale(self) -> bool:
        """Whether the server closed this idle connection or sent bytes nobody asked for."""
        if self._buf:
            return True
        self._sock.setblocking(False)
        try:
            self._sock.recv(1)  # b"": the server closed it; bytes: nobody asked for them
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False  # nothing waiting (TLS: at most a session ticket, consumed here)
        except OSError:
            pass
        return True

    # ---- sending -------------------------------------------------------------------------

    def call(self, args: list[str | bytes], deadline: float) -> None:
        """Send one command; a large argument goes out from its own buffer, not a copy."""
        chunks: list[bytes] = []
        head = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg.encode() if isinstance(arg, str) else arg
            head.append(b"$%d\r\n" % len(data))
            if len(data) > _CHUNK:
                chunks += [b"".join(head), data]
                head = [b"\r\n"]
            else:
                head += [data, b"\r\n"]
        chunks.append(b"".join(head))
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                self._sock.settimeout(_left(deadline))
                view = view[self._sock.send(view[:_CHUNK]) :]

    # ---- replies -------------------------------------------------------------------------

    def expect_ok(self, command: str, deadline: float) -> None:
        """Read a reply that must be +OK."""
        kind, rest = self._head(command, deadline)
        if (kind, rest) != (b"+", b"OK"):
            raise RemoteReplyError(f"{command} answered {_show(kind + rest)}, expected +OK")
        self._end(command)

    def expect_bulk(self, command: str, deadline: float, limit: int) -> bytearray | None:
        """Read a reply that must be a bulk string of at most `limit` bytes, or nil."""
        kind, rest = self._head(command, deadline)
        if kind != b"$" or not _LENGTH.fullmatch(rest):
            raise RemoteReplyError(f"{command} answered {_show(kind + rest)}, expected a bulk string or nil")
        size = int(rest)
        if size < 0:
            self._end(command)
            return None
        if size > limit:
            raise RemoteValueTooLargeError(size, limit)  # before reading any of it
        value = bytearray(size)
        view = memoryview(value)
        got = min(size, len(self._buf))
        view[:got] = self._buf[:got]
        del self._buf[:got]
        while got < size:
            self._sock.settimeout(_left(deadline))
            read = self._sock.recv_into(view[got:], min(size - got, _CHUNK))
            if not read:
                raise RemoteReplyError(f"the server closed the connection {size - got} bytes short of the value")
            got += read
        if self._line(command, deadline) != b"":
            raise RemoteReplyError(f"{command}: the value is not followed by CRLF")
        self._end(command)
        return value

    def _head(self, command: str, deadline: float) -> tuple[bytes, bytes]:
        line = self._line(command, deadline)
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RemoteReplyError(f"{command} answered with the error {_show(rest)}")
        return kind, rest

    def _line(self, command: str, deadline: float) -> bytes:
        start = 0
        while True:
            end = self._buf.find(b"\r\n", start)
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[: end + 2]
                return line
            if len(self._buf) > _MAX_LINE:
                raise RemoteReplyError(f"{command}: a reply line longer than {_MAX_LINE} bytes")
            start = max(0, len(self._buf) - 1)
            self._sock.settimeout(_left(deadline))
            data = self._sock.recv(_MAX_LINE)
            if not data:
                raise RemoteReplyError(f"the server closed the connection in the middle of the {command} reply")
            self._buf += data

    def _end(self, command: str) -> None:
        if self._buf:
            raise RemoteReplyError(f"{command}: unrequested bytes after the reply {_show(bytes(self._buf))}")


def _show(data: bytes) -> str:
    return repr(data[:60]) + ("..." if len(data) > 60 else "")


class RespClient:
    """GET and SET against one endpoint; a few idle connections are kept for reuse (thread-safe)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        on_fork_child(self._forget_parent)

    def get(self, key: bytes, limit: int) -> bytearray | None:
        """The value of `key`, None if it has none; RemoteValueTooLargeError past `limit` bytes."""
        deadline = time.monotonic() + self.endpoint.timeout
        conn = self._take(deadline)
        try:
            conn.call([b"GET", key], deadline)
            value = conn.expect_bulk("GET", deadline, limit)
        except BaseException:
            conn.close()
            raise
        self._give(conn)
        return value

    def set(self, key: bytes, value: bytes, px: int | None) -> None:
        """SET `key` to `value`, expiring in `px` milliseconds (None: never)."""
        deadline = time.monotonic() + self.endpoint.timeout
        conn = self._take(deadline)
        try:
            conn.call([b"SET", key, value, *([b"PX", b"%d" % px] if px else [])], deadline)
            conn.expect_ok("SET", deadline)
        except BaseException:
            conn.close()
            raise
        self._give(conn)

    def close(self) -> None:
        """Close the idle connections (one in use closes when its call ends)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self, deadline: float) -> _Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return _Connection(self.endpoint, deadline)
            if not conn.stale():
                return conn
            conn.close()

    def _give(self, conn: _Connection) -> None:
        with self._lock:
            if len(self._idle) < _KEEP_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _forget_parent(self) -> None:
        # The parent's sockets are shared with it: never read or write them here, and do not
        # close them either (a TLS close could send a close_notify on the parent's session).
        self._lock = threading.Lock()
        self._idle = []
