"""Single-flight: of the processes that miss the same key, one builds and the others wait for it.

The builder holds the key's lock (`_storage._locks`) until its entry is staged; a waiter
blocks on the lock and, once it gets it, looks again (`recheck`): the entry is there, or the
builder died and the waiter builds. Waiting is bounded by `lease_wait`; past it the waiter
builds without the lock, with a warning. Only a live build makes others wait: a holder seen
stopped for STOPPED_GRACE seconds (SIGSTOP, Ctrl-Z, a debugger) is passed over as a dead one
would be, with a warning naming it; the waiters then go single-flight again under the key's
next lock ("<digest>~1", up to _TAKEOVERS of them), so one of them builds. A stopped holder
that is continued finishes its build and stores an entry under the same key, of the same input:
the last store stays, and either is the module that key names.

A codegen that asks for the key its own thread is building (it lowers its own input again)
gets ReentrantLoweringError at once, not a wait on itself.

Across hosts that share a remote, the local lock's holder also takes the key's build lease in
the remote (`FleetFlight`): the OS lock stays per machine, the lease makes one builder per
fleet, and waiters poll the remote for the entry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from .._errors import ReentrantLoweringError
from .._forksafe import on_fork_child
from .._storage._locks import Held, Holder, KeyLocks

__all__ = ["FleetFlight", "Lease", "SingleFlight", "keeper"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# A waiter polls the remote for another host's entry this often, from the first to the last
# (about the build time of a small kernel, then a few times a second).
_FIRST_REMOTE_POLL, _MAX_REMOTE_POLL = 0.005, 0.1
# How many stopped holders of one key in a row are passed over before building without a lock.
_TAKEOVERS = 4


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
        held = self._lock(digest)
        if held is None:
            return None, None
        # Between our lookup and the lock, someone may have stored it (that is why we waited).
        found = recheck()
        if found is not None:
            self.locks.release(held)
            return None, found
        _this_thread.building[digest] = held
        return held, None

    def _lock(self, digest: str) -> Held | None:
        """The key's lock (or the next one, past stopped holders); None: build without one."""
        deadline = time.monotonic() + self.wait
        for takeover in range(_TAKEOVERS + 1):
            name = digest if takeover == 0 else f"{digest}~{takeover}"
            held = self.locks.acquire(name, wait=0.0)
            if held is None:
                if takeover == 0:
                    self._count("lease_waits")
                held = self.locks.acquire(name, wait=max(0.0, deadline - time.monotonic()))
            if isinstance(held, Holder):
                logger.warning("codegen cache: %s holds the build lock of %s but has been stopped for %.0fs "
                               "(SIGSTOP, Ctrl-Z, a debugger); not waiting for it any longer",
                               held.describe(), digest[:16], time.monotonic() - (held.stopped_since or 0.0))
                continue
            if held is None:
                found = self.locks.holder(name)
                logger.warning("codegen cache: waited %.0fs for %s to build %s; building here", self.wait,
                               found.describe() if found is not None else "another process", digest[:16])
            return held
        return None

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


# ---- across hosts: a build lease in the remote ------------------------------------------------


class Lease(NamedTuple):
    """A build lease this process holds in the remote: renewed by the keeper until released."""

    digest: str
    token: bytes
    leases: Any  # the remote tier's `Leases`


class LeaseKeeper:
    """One daemon thread per process that renews the leases it holds, three times per expiry.

    A build runs in TVM with the GIL released (and Python codegens give it up every few ms),
    so the renewals go on while the builder's thread is busy. A child made by fork holds none
    of its parent's leases and starts its own thread when it takes one.
    """

    def __init__(self) -> None:
        self._reset()
        on_fork_child(self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._held: dict[int, Lease] = {}
        self._thread: threading.Thread | None = None

    def hold(self, lease: Lease) -> None:
        """Renew `lease` until `drop`."""
        with self._cond:
            idle = not self._held
            self._held[id(lease)] = lease
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="codegen-cache-leases", daemon=True)
                self._thread.start()
            elif idle:
                self._cond.notify_all()  # it sleeps without a timeout while it holds nothing

    def drop(self, lease: Lease) -> None:
        """Stop renewing `lease`."""
        with self._cond:
            self._held.pop(id(lease), None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._held:
                    self._cond.wait()
                leases = list(self._held.values())
                self._cond.wait(min(lease.leases.expiry for lease in leases) / 3)
                leases = [lease for lease in leases if id(lease) in self._held]
            for lease in leases:
                if not lease.leases.renew(lease.digest, lease.token):
                    # Expired and maybe taken (or the remote is down): another host may build too.
                    logger.debug("codegen cache: lost the remote build lease of %s", lease.digest[:16])
                    self.drop(lease)


keeper = LeaseKeeper()


class FleetFlight(Generic[T]):
    """Take a key's build lease in the remote, or wait for its holder and find what it stored there.

    Beside the local lock (one builder per machine), so the hosts sharing a remote build each
    key about once. The lease expires (`leases.expiry`) unless renewed: a holder that dies
    delays the others by at most that, and a wait never lasts longer than `wait` (lease_wait).
    Where no lease can be had (the remote is down, writes are refused, read-only mode) nobody
    waits.
    """

    def __init__(self, leases: Any, *, wait: float, count: Callable[[str], None]) -> None:
        self.leases = leases
        self.wait = wait
        self._count = count

    def begin(self, digest: str, recheck: Callable[[], T | None]) -> tuple[Lease | None, T | None]:
        """(lease to release after storing, None) to build; (None, found) when another host built it.

        (None, None): no lease (remote unavailable, or the wait ran out): build without one.
        `recheck` looks the key up in the remote afresh.
        """
        # Imported here: the remote tier's modules (its client, TLS) load only where a remote is configured.
        from .._storage._leases import new_token

        token = new_token()
        taken = self.leases.take(digest, token)
        if taken is None:
            return None, None
        if not taken:
            self._count("remote_lease_waits")
            deadline = time.monotonic() + self.wait
            pause = _FIRST_REMOTE_POLL
            while True:
                if time.monotonic() + pause > deadline:
                    if self.wait > 0:
                        logger.warning("codegen cache: waited %.0fs for another host to build %s; building here",
                                       self.wait, digest[:16])
                    return None, None
                time.sleep(pause)
                pause = min(pause * 1.5, _MAX_REMOTE_POLL, self.leases.expiry / 4)
                found = recheck()
                if found is not None:
                    return None, found
                taken = self.leases.take(digest, token)
                if taken is None:
                    return None, None  # the remote went away: build now
                if taken:
                    break
            # Taken after another holder: it may have stored the entry just before it let go.
            found = recheck()
            if found is not None:
                self.leases.release(digest, token)
                return None, found
        lease = Lease(digest, token, self.leases)
        keeper.hold(lease)
        return lease, None

    @staticmethod
    def release(lease: Lease | None) -> None:
        """Let the next host in (after the entry is in the remote)."""
        if lease is not None:
            keeper.drop(lease)
            lease.leases.release(lease.digest, lease.token)
