"""Single-flight compiles across processes: leases in a diskcache store.

A lease is a row `key -> owner` added atomically (diskcache `add`, one SQLite transaction)
with an expiry. Its holder renews it from a heartbeat thread, so a holder killed with -9
stops renewing and its lease expires after `timeout` seconds; a holder on this host whose
pid is gone is taken over at once. Waiters poll for the entry and give up after `wait`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import weakref

from .._errors import ArtifactError
from ._disk import STORAGE_ERRORS, ArtifactStore

__all__ = ["LeaseManager"]

logger = logging.getLogger(__name__)
_HOST = socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LeaseManager:
    """Acquire, renew and release compile leases stored in `store`."""

    def __init__(self, store: ArtifactStore, *, timeout: float) -> None:
        self.store = store
        self.timeout = timeout
        self._held: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._heartbeat: threading.Thread | None = None
        self._stop = threading.Event()

    def _owner(self) -> bytes:
        return json.dumps({"host": _HOST, "pid": os.getpid(), "tid": threading.get_ident(), "t": time.time()}).encode()

    def try_acquire(self, key: str) -> bool:
        """Take the lease on `key` if it is free or stale; True when this caller holds it."""
        owner = self._owner()
        try:
            if self.store.add(key, owner, expire=self.timeout):
                self._hold(key, owner)
                return True
            try:
                current = self.store.get(key)
            except ArtifactError:
                # A row we did not write (SafeDisk refuses to unpickle it): stale, replace it.
                current = b"unreadable"
            if current is not None and self._is_stale(current):
                # Stale owner on this host: replace it; re-check that ours is the row now.
                self.store.put(key, owner, expire=self.timeout)
                if self.store.get(key) == owner:
                    logger.info("took over the stale compile lease of %s", key[:16])
                    self._hold(key, owner)
                    return True
            return False
        except STORAGE_ERRORS as err:
            # No lease storage: compile without single-flight rather than block.
            logger.debug("lease store unavailable for %s: %s", key[:16], err)
            return True

    def _is_stale(self, raw: bytes) -> bool:
        try:
            owner = json.loads(raw)
            return owner.get("host") == _HOST and not _pid_alive(int(owner.get("pid", -1)))
        except (ValueError, TypeError, AttributeError):
            return True

    def is_held_elsewhere(self, key: str) -> bool:
        """True while some other live owner holds the lease on `key`."""
        try:
            current = self.store.get(key)
        except (*STORAGE_ERRORS, ArtifactError):
            return False
        return current is not None and not self._is_stale(current)

    def _hold(self, key: str, owner: bytes) -> None:
        with self._lock:
            self._held[key] = owner
            if self._heartbeat is None or not self._heartbeat.is_alive():
                self._stop.clear()
                self._heartbeat = threading.Thread(
                    target=_renew_loop, args=(weakref.ref(self),), name="codegen-cache-lease", daemon=True
                )
                self._heartbeat.start()

    def release(self, key: str) -> None:
        """Give up the lease on `key` if this process holds it."""
        with self._lock:
            owner = self._held.pop(key, None)
        if owner is None:
            return
        try:
            if self.store.get(key) == owner:
                self.store.delete(key)
        except (*STORAGE_ERRORS, ArtifactError) as err:
            logger.debug("could not release lease %s: %s", key[:16], err)

    def renew_all(self) -> None:
        """Extend every lease this process holds."""
        with self._lock:
            held = dict(self._held)
        for key, owner in held.items():
            try:
                self.store.put(key, owner, expire=self.timeout)
            except STORAGE_ERRORS as err:
                logger.debug("could not renew lease %s: %s", key[:16], err)

    def held(self) -> list[str]:
        """Keys whose leases this process holds."""
        with self._lock:
            return list(self._held)


def _renew_loop(ref: weakref.ReferenceType[LeaseManager]) -> None:
    while True:
        manager = ref()
        if manager is None:
            return
        interval = max(0.05, manager.timeout / 3)
        stop = manager._stop
        if not manager.held():
            with manager._lock:
                if not manager._held:
                    manager._heartbeat = None
                    return
        manager.renew_all()
        del manager
        if stop.wait(interval):
            return
