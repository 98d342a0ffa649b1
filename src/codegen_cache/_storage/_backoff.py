"""Whether the remote tier tries a call now: an exponential backoff after failures, one per kind of call.

The tier keeps one for reads and one for writes, so that a refused write (a read-only
replica's READONLY, OOM, an ACL's NOPERM) stops writes only. A server that does not answer at
all (refused, reset, past the deadline) fails both: it puts both offline, so a cold miss pays
one deadline, not one per kind of call.
"""

from __future__ import annotations

import threading
import time

from .._forksafe import on_fork_child

__all__ = ["Backoff"]


class Backoff:
    """Offline for `backoff` seconds after a failure, doubling up to `max_backoff` until a success."""

    def __init__(self, backoff: float, max_backoff: float) -> None:
        self.backoff = backoff
        self.max_backoff = max(max_backoff, backoff)
        self._until = 0.0
        self._next = backoff
        self._lock = threading.Lock()
        self.forever: str | None = None  # why it will never be tried again in this process
        on_fork_child(self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread of the parent may have held it

    def offline(self) -> bool:
        """Whether calls are skipped now."""
        return self.forever is not None or time.monotonic() < self._until

    def failed(self) -> float | None:
        """Go offline; the delay, or None when another thread already did (within the current period)."""
        with self._lock:
            if self.offline():
                return None
            delay = self._next
            self._until = time.monotonic() + delay
            self._next = min(delay * 2, self.max_backoff)
            return delay

    def succeeded(self) -> bool:
        """A call worked; True when that ends a backoff (the remote is back)."""
        if self._next == self.backoff:
            return False
        with self._lock:
            self._next = self.backoff
        return True

    def stop(self, why: str) -> None:
        """Never try again in this process (a setting the server cannot work with)."""
        self.forever = why
