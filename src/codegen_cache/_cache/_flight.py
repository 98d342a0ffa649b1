"""Single-flight: of the processes that miss the same key, one builds and the others wait for it.

The builder holds the key's lock (`_storage._locks`) until its entry is staged; a waiter
blocks on the lock and, once it gets it, looks again (`recheck`): the entry is there, or the
builder died and the waiter builds. Waiting is bounded by `lease_wait`; past it the waiter
builds without the lock, with a warning. A codegen that asks for the key its own thread is
building (it lowers its own input again) gets ReentrantLoweringError at once, not a wait on itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from .._errors import ReentrantLoweringError
from .._forksafe import on_fork_child
from .._storage._locks import Held, KeyLocks

__all__ = ["SingleFlight"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _ThisThread(threading.local):
    """The keys whose build lock this thread holds, by key digest."""

    def __init__(self) -> None:
        self.building: dict[str, Held] = {}
        self.reentered: set[str] = set()  # keys a codegen asked for again while building them


_this_thread = _ThisThread()


def _forget_builds() -> None:
    # A forked child builds nothing its parent's threads were building.
    global _this_thread
    _this_thread = _ThisThread()


on_fork_child(_forget_builds)


class SingleFlight(Generic[T]):
    """Take a key's build lock, or wait for its holder and find what it stored."""

    def __init__(self, locks: KeyLocks, *, wait: float, count: Callable[[str], None]) -> None:
        self.locks = locks
        self.wait = wait
        self._count = count

    def begin(self, digest: str, recheck: Callable[[], T | None], *,
              codegen: str = "") -> tuple[Held | None, T | None]:
        """(lock to release after storing, None) to build; (None, found) when another built it.

        (None, None): the wait ran out; build without the lock. ReentrantLoweringError when
        this thread holds the key's lock already (its codegen asks for its own key).
        """
        if digest in _this_thread.building:
            _this_thread.reentered.add(digest)
            raise ReentrantLoweringError(codegen, digest)
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
            self.locks.release(held)
            return None, found
        _this_thread.building[digest] = held
        return held, None

    @staticmethod
    def reentered(digest: str) -> bool:
        """Whether the codegen building `digest` on this thread asked for it again (once per ask).

        The error raised there may reach the builder as another type (tvm-ffi turns a Python
        error it does not know into a RuntimeError on its way through a packed function).
        """
        if digest in _this_thread.reentered:
            _this_thread.reentered.discard(digest)
            return True
        return False

    def release(self, held: Held | None) -> None:
        """Let the next waiter in."""
        if held is not None:
            building = _this_thread.building
            for digest in [d for d, h in building.items() if h is held]:
                del building[digest]
            self.locks.release(held)
