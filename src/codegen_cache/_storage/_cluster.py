"""What a Redis Cluster client must know, without a socket: key slots, redirects, the slot map.

Redis Cluster splits the keys into 16384 slots (CRC16 of the key, or of its `{hash tag}`) and
gives each master a set of them. A node asked for a key it does not serve answers
`-MOVED <slot> <host>:<port>` (the slot lives there now: remember it) or `-ASK <slot>
<host>:<port>` (this one key is on its way there: ask that node once, after ASKING). The map
of every slot comes from `CLUSTER SLOTS` (Redis 3.0 and later; deprecated but kept in 7,
where CLUSTER SHARDS also exists).

A single server is a cluster of one that never redirects: the client starts as such, and only
a redirect makes it read the map (so single-node deployments never send CLUSTER SLOTS).
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Iterable

from .._errors import RemoteReplyError

__all__ = ["SLOTS", "Redirect", "SlotMap", "key_slot", "parse_redirect"]

SLOTS = 16384
_REDIRECT = re.compile(rb"(MOVED|ASK) (0|[1-9][0-9]{0,4}) (\S{0,255}):([1-9][0-9]{0,4})")


def key_slot(key: bytes) -> int:
    """The cluster slot of `key`: CRC16 (XMODEM) of its hash tag if it has one, else of the key, mod 16384."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:  # "{}" is no tag: the whole key is hashed
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) % SLOTS


class Redirect(RemoteReplyError):
    """A cluster node's -MOVED or -ASK: the key's slot is served at `address`."""

    def __init__(self, kind: str, slot: int, address: tuple[str, int]) -> None:
        super().__init__(f"{kind} {slot} to {address[0]}:{address[1]}")
        self.kind = kind
        self.slot = slot
        self.address = address

    def __reduce__(self):
        return (Redirect, (self.kind, self.slot, self.address))


def parse_redirect(error: bytes) -> tuple[str, int, tuple[str, int]] | None:
    """(MOVED or ASK, slot, (host, port)) of an error reply's text, or None when it is another error.

    An empty host (a node that does not know its own address) is returned as "": the caller
    asks the node that redirected.
    """
    match = _REDIRECT.fullmatch(error)
    if match is None:
        return None
    kind, slot, host, port = match.groups()
    if int(slot) >= SLOTS or int(port) > 65535:
        return None
    try:
        text = host.decode("ascii")
    except UnicodeDecodeError:
        return None
    return kind.decode(), int(slot), (text.strip("[]"), int(port))


class SlotMap:
    """Slot -> the (host, port) of its master, from CLUSTER SLOTS and MOVED redirects."""

    def __init__(self) -> None:
        self.clustered = False  # True once any node redirected: the map then routes every key
        self._owner: list[tuple[str, int] | None] = [None] * SLOTS
        self.stale = False  # the map was changed by a redirect, or a node failed: read it again

    def node_for(self, key: bytes, default: tuple[str, int]) -> tuple[str, int]:
        """Where to send a command on `key` (`default`, the URL's node, when not known)."""
        if not self.clustered:
            return default
        return self._owner[key_slot(key)] or default

    def moved(self, slot: int, address: tuple[str, int]) -> None:
        """A -MOVED: the slot is served at `address` from now on."""
        self.clustered = True
        self._owner[slot] = address
        self.stale = True

    def nodes(self) -> list[tuple[str, int]]:
        """The known masters, each once, in slot order."""
        return list(dict.fromkeys(a for a in self._owner if a is not None))

    def load(self, reply: list, asked: tuple[str, int]) -> None:
        """Take the map from a CLUSTER SLOTS reply given by the node at `asked`; RemoteReplyError if malformed."""
        owner: list[tuple[str, int] | None] = [None] * SLOTS
        for start, end, address in _ranges(reply, asked):
            owner[start : end + 1] = [address] * (end + 1 - start)
        self._owner = owner
        self.clustered = True
        self.stale = False


def _ranges(reply: list, asked: tuple[str, int]) -> Iterable[tuple[int, int, tuple[str, int]]]:
    """(first slot, last slot, master address) of each range of a CLUSTER SLOTS reply."""
    if not reply:
        raise RemoteReplyError("CLUSTER SLOTS answered no slots (a cluster that is not set up yet)")
    for item in reply:
        if not (isinstance(item, list) and len(item) >= 3 and isinstance(item[0], int) and isinstance(item[1], int)
                and 0 <= item[0] <= item[1] < SLOTS):
            raise RemoteReplyError(f"CLUSTER SLOTS: a slot range {str(item)[:80]} is malformed")
        node = item[2]
        if not (isinstance(node, list) and len(node) >= 2 and isinstance(node[0], (bytes, type(None)))
                and isinstance(node[1], int) and 0 < node[1] <= 65535):
            raise RemoteReplyError(f"CLUSTER SLOTS: a node {str(node)[:80]} is malformed")
        try:
            host = (node[0] or b"").decode("ascii")
        except UnicodeDecodeError:
            raise RemoteReplyError("CLUSTER SLOTS: a node's address is not ASCII") from None
        # "" or "?": the node does not know its address; it is the one that answered.
        yield item[0], item[1], ((host if host not in ("", "?") else asked[0]), node[1])
