"""One connection to a Redis server (RESP2 over a plain or TLS socket), every step bounded by one deadline.

The remote tier needs its calls to fail in a bounded way whatever the server does. So a
connection:

- takes the call's monotonic deadline in every step: connecting, the TLS handshake, AUTH,
  SELECT, sending and every read; a server that trickles its reply a byte at a time ends the
  call at the deadline, where a per-read socket timeout would let it run on for ever;
- parses replies strictly: each command accepts exactly the reply types Redis sends for it
  (`+OK`, a bulk string or nil, an integer, the arrays of CLUSTER SLOTS), with length-capped
  lines and exact length syntax; anything else raises RemoteReplyError;
- checks a bulk string's announced length against the caller's cap before reading a byte of
  it, so a planted huge value costs no memory;
- turns an error reply into RemoteRefusedError (its code: READONLY, OOM, NOSCRIPT, ...) and a
  cluster's redirect (`-MOVED`, `-ASK`) into Redirect; after either the connection is still in
  step, every other fault leaves it unusable (the caller closes it).

Every failure is an OSError: socket errors, TimeoutError at the deadline, ssl.SSLError, and
RemoteReplyError (a ConnectionError) for the server's protocol faults. `_client` routes calls
over connections; `_endpoint` says where they go.
"""

from __future__ import annotations

import re
import ssl

from .._errors import ConfigError, RemoteRefusedError, RemoteReplyError, RemoteValueTooLargeError
from ._cluster import Redirect, parse_redirect
from ._endpoint import Endpoint, connect, left, show_address, speaks_tls

__all__ = ["Connection", "Endpoint"]

_MAX_LINE = 4096  # a status, error or length line; Redis's are far shorter
_LENGTH = re.compile(rb"-1|0|[1-9][0-9]{0,17}")
_INTEGER = re.compile(rb"-?(0|[1-9][0-9]{0,18})")
_CHUNK = 1 << 18
_ARRAY_ITEMS = 1 << 16  # CLUSTER SLOTS of the largest cluster is far smaller
_ARRAY_DEPTH = 4
_CLUSTER_SELECT = b"SELECT is not allowed in cluster mode"


class Connection:
    """One socket to one server; every method takes the call's deadline."""

    def __init__(self, endpoint: Endpoint, deadline: float) -> None:
        self.endpoint = endpoint
        self._buf = bytearray()
        self._answered = False  # any reply byte yet (a plain client at a TLS port never gets one)
        # Set by a cluster client for the commands of one call that a node redirected with -ASK:
        # ASKING admits only the command right after it, and a call may send several (a script's
        # EVALSHA, then its EVAL where the node lacks it), so each is preceded by its own ASKING.
        self.asking = False
        self._sock = connect(endpoint.address, deadline)
        try:
            if endpoint.tls is not None:
                self._handshake(endpoint, deadline)
            if endpoint.password is not None:
                user = [endpoint.username] if endpoint.username else []
                self.call(["AUTH", *user, endpoint.password], deadline)
                self.expect_ok("AUTH", deadline)
            if endpoint.db:
                self.call(["SELECT", str(endpoint.db)], deadline)
                try:
                    self.expect_ok("SELECT", deadline)
                except RemoteRefusedError as err:
                    if _CLUSTER_SELECT in err.message.encode():
                        raise ConfigError("remote (CODEGEN_CACHE_REMOTE)", f"database {endpoint.db}",
                                          "database 0 for a Redis Cluster, which has no other: drop the /N or "
                                          "db=N from the URL") from None
                    raise
        except BaseException:
            self.close()
            raise

    def _handshake(self, endpoint: Endpoint, deadline: float) -> None:
        host = endpoint.address[0] if isinstance(endpoint.address, tuple) else None
        try:
            self._sock.settimeout(left(deadline))  # CPython bounds the whole handshake by it
            self._sock = endpoint.tls.wrap_socket(self._sock, server_hostname=host)
        except TimeoutError as err:
            # A plain-text Redis reads a ClientHello as the start of an inline command and waits.
            raise TimeoutError(f"the TLS handshake with {show_address(endpoint.address)} ran past the deadline "
                               f"({err}; if that port is not a TLS port, use a redis:// URL)") from None

    def close(self) -> None:
        """Close the socket."""
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
        """Send one command (after ASKING where `asking` is set); a large argument goes out from its own buffer."""
        if self.asking:
            self._send([b"ASKING"], deadline)
            self.expect_ok("ASKING", deadline)
        self._send(args, deadline)

    def _send(self, args: list[str | bytes], deadline: float) -> None:
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
                self._sock.settimeout(left(deadline))
                view = view[self._sock.send(view[:_CHUNK]) :]

    # ---- replies -------------------------------------------------------------------------

    def expect_ok(self, command: str, deadline: float, *, nil: bool = False) -> bool:
        """Read a reply that must be +OK (True), or with nil=True a nil bulk string (False: SET NX found the key)."""
        kind, rest = self._head(command, deadline)
        if nil and kind == b"$" and rest == b"-1":
            self._end(command)
            return False
        if (kind, rest) != (b"+", b"OK"):
            expected = "+OK or nil" if nil else "+OK"
            raise RemoteReplyError(f"{command} answered {_show(kind + rest)}, expected {expected}")
        self._end(command)
        return True

    def expect_int(self, command: str, deadline: float) -> int:
        """Read a reply that must be an integer."""
        kind, rest = self._head(command, deadline)
        if kind != b":" or not _INTEGER.fullmatch(rest):
            raise RemoteReplyError(f"{command} answered {_show(kind + rest)}, expected an integer")
        self._end(command)
        return int(rest)

    def expect_bulk(self, command: str, deadline: float, limit: int) -> bytearray | None:
        """Read a reply that must be a bulk string of at most `limit` bytes, or nil."""
        kind, rest = self._head(command, deadline)
        value = self._bulk(command, kind, rest, deadline, limit)
        self._end(command)
        return value

    def expect_array(self, command: str, deadline: float, limit: int) -> list:
        """Read an array of integers, bulk strings (None for nil) and arrays, at most `limit` bytes in all."""
        budget = [limit]
        value = self._item(command, deadline, budget, 0)
        if budget[0] < 0:
            raise RemoteReplyError(f"{command}: a reply larger than {limit} bytes")
        if not isinstance(value, list):
            raise RemoteReplyError(f"{command} answered {_show(repr(value).encode())}, expected an array")
        self._end(command)
        return value

    def _item(self, command: str, deadline: float, budget: list[int], depth: int):
        kind, rest = self._head(command, deadline)
        budget[0] -= len(rest) + 3
        if kind == b":" and _INTEGER.fullmatch(rest):
            return int(rest)
        if kind == b"$":
            value = self._bulk(command, kind, rest, deadline, max(0, budget[0]))
            budget[0] -= len(value or b"")
            return None if value is None else bytes(value)
        if kind == b"*" and _LENGTH.fullmatch(rest) and rest != b"-1" and depth < _ARRAY_DEPTH:
            count = int(rest)
            if count > _ARRAY_ITEMS:
                raise RemoteReplyError(f"{command}: an array of {count} items")
            items = []
            for _ in range(count):
                items.append(self._item(command, deadline, budget, depth + 1))
                if budget[0] < 0:
                    return items  # expect_array says so
            return items
        raise RemoteReplyError(f"{command} answered {_show(kind + rest)} inside an array")

    def _bulk(self, command: str, kind: bytes, rest: bytes, deadline: float, limit: int) -> bytearray | None:
        if kind != b"$" or not _LENGTH.fullmatch(rest):
            raise RemoteReplyError(f"{command} answered {_show(kind + rest)}, expected a bulk string or nil")
        size = int(rest)
        if size < 0:
            return None
        if size > limit:
            raise RemoteValueTooLargeError(size, limit)  # before reading any of it
        value = bytearray(size)
        view = memoryview(value)
        got = min(size, len(self._buf))
        view[:got] = self._buf[:got]
        del self._buf[:got]
        while got < size:
            self._sock.settimeout(left(deadline))
            read = self._sock.recv_into(view[got:], min(size - got, _CHUNK))
            if not read:
                raise RemoteReplyError(f"the server closed the connection {size - got} bytes short of the value")
            got += read
        if self._line(command, deadline) != b"":
            raise RemoteReplyError(f"{command}: the value is not followed by CRLF")
        return value

    def _head(self, command: str, deadline: float) -> tuple[bytes, bytes]:
        line = self._line(command, deadline)
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            redirect = parse_redirect(rest)
            if redirect is not None:
                raise Redirect(*redirect)
            raise RemoteRefusedError(command, _text(rest))
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
            self._sock.settimeout(left(deadline))
            try:
                data = self._sock.recv(_MAX_LINE)
            except ConnectionResetError as err:
                self._first_reply_failed(command, deadline, str(err))
                raise
            if not data:
                self._first_reply_failed(command, deadline, "closed")
                raise RemoteReplyError(f"the server closed the connection in the middle of the {command} reply")
            self._answered = True
            self._buf += data

    def _first_reply_failed(self, command: str, deadline: float, how: str) -> None:
        """A plain connection broken before any reply: a TLS port says so (one more connection, same deadline)."""
        address = self.endpoint.address
        if self._answered or self.endpoint.tls is not None or isinstance(address, str):
            return
        if speaks_tls(address, deadline):
            raise RemoteReplyError(f"{show_address(address)} speaks TLS and dropped the plain-text {command} "
                                   f"({how}): use a rediss:// URL for it")

    def _end(self, command: str) -> None:
        if self._buf:
            raise RemoteReplyError(f"{command}: unrequested bytes after the reply {_show(bytes(self._buf))}")


def _show(data: bytes) -> str:
    return repr(data[:60]) + ("..." if len(data) > 60 else "")


def _text(data: bytes) -> str:
    return data[:300].decode("utf-8", "replace")
