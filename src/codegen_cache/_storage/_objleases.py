"""Build leases in an object store: create-only lease objects with an expiry, as `_leases` is for Redis.

A lease is an object `lease/<digest>` holding `<expiry, ms since the epoch> <token>`, created
only where none is (If-None-Match: *): of the hosts that try at once, one creates it. A lease
whose expiry has passed belongs to nobody: a host that finds one deletes it and tries to create
its own once more (one released between the two is held: that host waits and looks again) (two hosts doing that at once may both build: single-flight saves work, it is
not needed for correctness). The holder renews it by writing a later expiry and deletes it once
the entry is stored, each time only if the token read there is still its own.

The expiry is the holder's wall clock: hosts of a fleet keep their clocks in step (NTP) within
a fraction of the expiry, or a waiter may take over a live lease early (one more build).

These are writes: where writes are off (read-only mode, a refused write, an outage) `take`
answers None and nobody waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ._health import FAILED, Health
from ._s3client import S3Client

__all__ = ["ObjectLeases"]

_LEASE_BYTES = 256


class ObjectLeases:
    """take / renew / release the build lease of a key in a bucket; each call bounded by the tier's deadline."""

    def __init__(self, client: S3Client, health: Health, key: Callable[[str], str], *, expiry: float,
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
        taken = self._health.attempt(self._health.writes, "lease", lambda: self._take(digest, token))
        return None if taken is FAILED else taken

    def _take(self, digest: str, token: bytes) -> bool:
        name = self._key(digest)
        if self._client.create(name, self._value(token)):
            return True
        held = self._read(name)
        if held is None or held[0] > time.time() * 1000:
            # Held, or released since the create: its holder may have stored the entry just now,
            # so this host waits and looks the entry up again (as a refused SET NX does in Redis).
            return False
        self._client.delete(name)  # expired: its holder is gone; free for whoever creates it first
        return self._client.create(name, self._value(token))

    def renew(self, digest: str, token: bytes) -> bool:
        """Extend the lease by its expiry; False when it is not this token's any more (or the call failed)."""
        if not self.enabled or self._health.writes.offline():
            return False

        def renew() -> bool:
            name = self._key(digest)
            held = self._read(name)
            if held is None or held[1] != token:
                return False
            self._client.overwrite(name, self._value(token))
            return True

        return self._health.attempt(self._health.writes, "lease renewal", renew) is True

    def release(self, digest: str, token: bytes) -> bool:
        """Delete the lease if this token holds it; True when it did."""
        if not self.enabled or self._health.writes.offline():
            return False

        def release() -> bool:
            name = self._key(digest)
            held = self._read(name)
            if held is None or held[1] != token:
                return False
            self._client.delete(name)
            return True

        return self._health.attempt(self._health.writes, "lease release", release) is True

    def _value(self, token: bytes) -> bytes:
        return b"%d %s" % (int((time.time() + self.expiry) * 1000), token)

    def _read(self, name: str) -> tuple[int, bytes] | None:
        """(expiry in ms, token) of the lease object, or None when there is none."""
        value = self._client.read_if_any(name, _LEASE_BYTES)
        if value is None:
            return None
        expiry, _, token = value.partition(b" ")
        if not expiry.isdigit() or not token:
            return (0, b"")  # not a lease this tier wrote: treated as expired
        return int(expiry), token
