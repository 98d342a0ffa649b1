"""A misbehaving Redis on a loopback port: it speaks just enough RESP2 to answer wrongly on cue.

It behaves like Redis for what the remote tier sends (GET, SET with NX and PX, its scripts by
EVALSHA and EVAL, the handshake), so a test changes only the one reply it is about.

Each test passes `answer(conn, command)`, called for every command a client sends; it may send
anything (`conn.send`), trickle it, close the connection, reset it, or behave like Redis
(`fake.behave`). Threads are daemons with socket timeouts, so a failing test cannot hang on it.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable


class FakeConn:
    """One accepted connection, seen from the server."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sent = 0
        self._file = sock.makefile("rb")

    def read_command(self) -> list[bytes] | None:
        """The next command (a RESP array of bulk strings), None when the client closed."""
        head = self._file.readline()
        if not head.startswith(b"*"):
            return None  # the client closed, or spoke something else (a TLS ClientHello): hang up
        args = []
        for _ in range(int(head[1:])):
            size = int(self._file.readline()[1:])
            args.append(self._file.read(size + 2)[:-2])
        return args

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)
        self.sent += len(data)

    def trickle(self, data: bytes, every: float) -> None:
        """Send one byte every `every` seconds."""
        for i in range(len(data)):
            self.send(data[i : i + 1])
            time.sleep(every)

    def reset(self) -> None:
        """Close with a TCP reset (RST), as a crashed or firewalled server does."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    def close(self) -> None:
        # The reader holds the descriptor too: close both, or no FIN (or RST) is ever sent.
        self._file.close()
        self.sock.close()


Answer = Callable[[FakeConn, list[bytes]], None]


class FakeRedis:
    """A loopback server; `answer` decides every reply (default: behave like Redis)."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.answer = answer or self.behave
        self.store: dict[bytes, bytes] = {}
        self.commands: list[list[bytes]] = []
        self.connections = 0
        self.handled: list[FakeConn] = []
        self.finished = threading.Event()  # set each time a connection's handler ends
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, auth: str = "", db: int = 0) -> str:
        return f"redis://{auth + '@' if auth else ''}127.0.0.1:{self.port}/{db}"

    def behave(self, conn: FakeConn, command: list[bytes]) -> None:
        """Answer as Redis does."""
        name = command[0].upper()
        if name == b"GET":
            value = self.store.get(command[1])
            conn.send(b"$-1\r\n" if value is None else b"$%d\r\n%s\r\n" % (len(value), value))
        elif name == b"SET":
            if b"NX" in (a.upper() for a in command[3:]) and command[1] in self.store:
                conn.send(b"$-1\r\n")
                return
            self.store[command[1]] = command[2]
            conn.send(b"+OK\r\n")
        elif name in (b"EVALSHA", b"EVAL"):
            self._script(conn, name, command)
        elif name == b"HELLO":  # what redis-py 8 sends first
            proto = int(command[1]) if len(command) > 1 else 2
            fields = b"$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:%d\r\n" % proto
            conn.send((b"%3\r\n" if proto == 3 else b"*6\r\n") + fields + b"$7\r\nversion\r\n$5\r\n7.0.0\r\n")
        elif name in (b"AUTH", b"SELECT", b"CLIENT", b"PING"):
            conn.send(b"+OK\r\n")
        else:
            conn.send(b"-ERR unknown command\r\n")

    def _script(self, conn: FakeConn, name: bytes, command: list[bytes]) -> None:
        """The tier's scripts (_storage/_scripts.py), as Redis would run them; one key each."""
        import hashlib

        from codegen_cache._storage import _scripts

        scripts = {s.sha.encode(): s for s in (_scripts.REPLACE, _scripts.REFRESH, _scripts.RENEW, _scripts.RELEASE)}
        script = scripts.get(command[1] if name == b"EVALSHA" else hashlib.sha1(command[1]).hexdigest().encode())
        if script is None:
            conn.send(b"-NOSCRIPT No matching script.\r\n")
            return
        key, args, value = command[3], command[4:], self.store.get(command[3])
        if script is _scripts.REPLACE:
            done = value is None or hashlib.sha1(value).hexdigest().encode() == args[0]
            if done:
                self.store[key] = args[1]
        elif script is _scripts.RELEASE:
            done = value == args[0]
            if done:
                del self.store[key]
        else:  # RENEW compares the token; REFRESH would extend a TTL (the fake keeps none)
            done = script is _scripts.RENEW and value == args[0]
        conn.send(b":%d\r\n" % done)

    def close(self) -> None:
        self._listener.close()
        for conn in self.handled:
            conn.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            sock.settimeout(10)
            self.connections += 1
            conn = FakeConn(sock)
            self.handled.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: FakeConn) -> None:
        try:
            while (command := conn.read_command()) is not None:
                self.commands.append(command)
                self.answer(conn, command)
        except (OSError, ValueError):
            pass  # the client went away, or the test closed the connection
        finally:
            self.finished.set()
