"""Build leases in the remote: at most one host of a fleet builds a key at a time.

A lease is a key `lease:<digest>` holding its holder's random token, written with SET NX PX
(taken only where no lease is) and an expiry of a few seconds: a holder that dies stops
nobody for longer than that. The holder renews it while it builds and deletes it when the
entry is stored, each time only if the token is still its own (scripts compare it: a lease
that expired and went to another host stays that host's).

These are writes: where writes are off (read-only mode, a refused write, an outage) `take`
answers None and nobody waits.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ._client import RespClient
from ._health import FAILED, Health
from ._scripts import RELEASE, RENEW

__all__ = ["Leases", "new_token"]


def new_token() -> bytes:
    """A holder's token: random, with the process id for whoever reads the lease with redis-cli."""
    return b"%d:%s" % (os.getpid(), os.urandom(12).hex().encode())


class Leases:
    """take / renew / release the build lease of a key; every call is bounded by the tier's deadline."""

    def __init__(self, client: RespClient, health: Health, key: Callable[[str], str], *, expiry: float,
                 enabled: bool) -> None:
        self._client = client
        self._health = health
        self._key = key
        self.expiry = expiry
        self.enabled = enabled and expiry > 0

    def take(self, digest: str, token: bytes) -> bool | None:
        """True: this token holds the lease now; False: another holder has it; None: no lease can be had."""
        if not self.enabled or self._health.writes.offline():
            return None
        name = self._key(digest).encode()
        taken = self._health.attempt(self._health.writes, "lease",
                                     lambda: self._client.set(name, token, max(1, int(self.expiry * 1000)), nx=True))
        return None if taken is FAILED else taken

    def renew(self, digest: str, token: bytes) -> bool:
        """Extend the lease by its expiry; False when it is not this token's any more (or the call failed)."""
        return self._compare(RENEW, digest, token, [b"%d" % max(1, int(self.expiry * 1000))], "lease renewal")

    def release(self, digest: str, token: bytes) -> bool:
        """Delete the lease if this token holds it; True when it did."""
        return self._compare(RELEASE, digest, token, [], "lease release")

    def _compare(self, script, digest: str, token: bytes, args: list[bytes], op: str) -> bool:
        if not self.enabled or self._health.writes.offline():
            return False
        done = self._health.attempt(self._health.writes, op, lambda: self._client.run(
            script, self._key(digest).encode(), [token, *args], lambda conn, cmd, deadline: conn.expect_int(cmd, deadline)))
        return done == 1
