"""Single-flight: of the processes that miss the same key, one builds and the others wait for it.

The builder holds the key's lock (`_storage._locks`) until its entry is staged; a waiter
blocks on the lock and, once it gets it, looks again (`recheck`): the entry is there, or the
builder died and the waiter builds. Waiting is bounded by `lease_wait`; past it the waiter
builds without the lock, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from .._storage._locks import Held, KeyLocks

__all__ = ["SingleFlight"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """Take a key's build lock, or wait for its holder and find what it stored."""

    def __init__(self, locks: KeyLocks, *, wait: float, count: Callable[[str], None]) -> None:
        self.locks = locks
        self.wait = wait
        self._count = count

    def begin(self, digest: str, recheck: Callable[[], T | None]) -> tuple[Held | None, T | None]:
        """(lock to release after storing, None) to build; (None, found) when another built it.

        (None, None): the wait ran out; build without the lock.
        """
        held = self.locks.acquire(digest, wait=0.0)
        if held is None:
            self._count("lease_waits")
            held = self.locks.acquire(digest, wait=self.wait)
            if held is None:
                logger.warning("codegen cache: waited %.0fs for another process to build %s; building here",
                               self.wait, digest[:16])
                return None, None
        # Between our lookup and the lock, someone may have stored it (that is why we waited).
        found = recheck()
        if found is not None:
            self.release(held)
            return None, found
        return held, None

    def release(self, held: Held | None) -> None:
        """Let the next waiter in."""
        if held is not None:
            self.locks.release(held)
