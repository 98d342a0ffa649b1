"""Where and how the remote tier connects: one server's address, credentials, database, TLS, deadline.

A URL that `_config.check_remote_url` accepted becomes an `Endpoint`; `connect` opens a socket to
it within a call's deadline. A Redis Cluster is
reached through the endpoint of any one of its nodes: the client makes the endpoints of the
others from it (`at`), with the same credentials, TLS settings and deadline.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["Endpoint", "connect", "left", "show_address", "speaks_tls"]

_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TRUE = ("1", "true", "yes", "on")


def show_address(address: tuple[str, int] | str) -> str:
    """host:port, [v6]:port or the socket path, for messages."""
    if isinstance(address, str):
        return address
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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

    def at(self, address: tuple[str, int]) -> Endpoint:
        """The same endpoint at another node's address (a cluster's redirect or slot map)."""
        return dataclasses.replace(self, address=address)


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


def left(deadline: float) -> float:
    """Seconds until `deadline`; TimeoutError once it has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("the remote call ran past its deadline")
    return remaining


def connect(address: tuple[str, int] | str, deadline: float) -> socket.socket:
    """A connected socket; every address of the host is tried within the one deadline."""
    if isinstance(address, str):
        targets = [(socket.AF_UNIX, socket.SOCK_STREAM, 0, "", address)]
    elif (family := _numeric_family(address[0])) is not None:
        # An IP address needs no resolver: a process's first getaddrinfo loads the resolver's
        # configuration, which costs a fresh process's first remote call more than the connect.
        targets = [(family, socket.SOCK_STREAM, 0, "", address)]
    else:
        # Name resolution is the system resolver's, with its own timeouts.
        try:
            targets = socket.getaddrinfo(*address, type=socket.SOCK_STREAM)
        except UnicodeError as err:  # a host name IDNA cannot encode ("a..b")
            raise OSError(f"cannot resolve {address[0]!r}: {err}") from None
    error: OSError = OSError(f"no address for {address!r}")
    for family, kind, proto, _name, target in targets:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left(deadline))
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


def _numeric_family(host: str) -> socket.AddressFamily | None:
    """AF_INET or AF_INET6 for an IP address literal (not a scoped IPv6 one); None for a name."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 6 and "%" in host:
        return None  # the scope (an interface name) is the resolver's to read
    return socket.AF_INET6 if ip.version == 6 else socket.AF_INET


def speaks_tls(address: tuple[str, int], deadline: float) -> bool:
    """Whether the server at `address` answers a TLS handshake (asked after a plain connection broke)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the question is only "TLS or not"
    try:
        with connect(address, deadline) as sock:
            sock.settimeout(left(deadline))
            with context.wrap_socket(sock):
                return True
    except ssl.SSLError as err:
        return "ALERT" in str(err.reason or "").upper()  # it spoke TLS, and refused us (client certificates)
    except OSError:
        return False
