"""Single-flight builds across processes: one OS file lock per key, held only while building.

A builder holds `flock(LOCK_EX)` on `<dir>/locks/<key>` from its miss until its entry is
written. The kernel drops the lock when the holder dies (kill -9, SIGTERM, os._exit), so no
heartbeat, process-id probe or expiry is needed, and a planted or stale file holds nothing:
only a live build makes anyone wait. The holder removes the file before unlocking; a waiter
that then locks a removed file sees that the path is gone or names another file, and retries
on the new one. A child made by fork closes its copies of the parent's lock descriptors
without unlocking them (an unlock would release the parent's lock: it is shared).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .._forksafe import on_fork_child
from ._faults import FILE_MODE, ensure_dir

__all__ = ["Held", "KeyLocks"]

logger = logging.getLogger(__name__)

_FIRST_POLL, _MAX_POLL = 0.001, 0.01  # a wait ends within 10 ms of the holder's unlock
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(slots=True)
class Held:
    """A lock this process holds: its descriptor and path (fd -1: building without a lock)."""

    fd: int
    path: str
    waited: float = 0.0


class KeyLocks:
    """Per-key build locks in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = str(directory)
        self._held: dict[int, Held] = {}
        self._lock = threading.Lock()
        on_fork_child(self._forget_parent_locks)

    def _forget_parent_locks(self) -> None:
        for held in self._held.values():
            try:
                os.close(held.fd)  # close only: flock(LOCK_UN) here would unlock the parent's build
            except OSError:
                pass
        self._held = {}
        self._lock = threading.Lock()

    def acquire(self, key: str, *, wait: float) -> Held | None:
        """Lock `key`, waiting up to `wait` seconds for a live holder; None when the wait ran out.

        A lock that cannot be taken at all (unwritable directory, a non-file planted at the
        path) gives a Held with fd -1: build without single-flight rather than block.
        """
        path = os.path.join(self.directory, key)
        start = time.monotonic()
        poll = _FIRST_POLL
        while True:
            fd = self._open(path)
            if fd < 0:
                return Held(-1, path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                elapsed = time.monotonic() - start
                if elapsed >= wait:
                    return None
                time.sleep(min(poll, wait - elapsed))
                poll = min(poll * 2, _MAX_POLL)
                continue
            except OSError as err:
                os.close(fd)
                logger.debug("codegen cache: cannot lock %s (%s); building without single-flight", path, err)
                return Held(-1, path)
            if self._still_linked(fd, path):
                held = Held(fd, path, time.monotonic() - start)
                with self._lock:
                    self._held[fd] = held
                return held
            os.close(fd)  # the holder removed this file as we locked it: lock the new one

    def _open(self, path: str) -> int:
        for attempt in (0, 1):
            try:
                fd = os.open(path, _OPEN_FLAGS, FILE_MODE)
            except FileNotFoundError:
                if attempt:
                    return -1
                try:  # first use, or the directory was removed under us
                    ensure_dir(self.directory)
                except OSError:
                    return -1
                continue
            except OSError as err:  # a symlink (ELOOP), read-only, no permission
                logger.debug("codegen cache: cannot open lock %s: %s", path, err)
                return -1
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    return fd
            except OSError:
                pass
            os.close(fd)  # a FIFO, socket or device planted at the path: it is not ours to lock
            return -1
        return -1

    @staticmethod
    def _still_linked(fd: int, path: str) -> bool:
        try:
            mine, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
        except OSError:
            return False
        return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)

    def release(self, held: Held) -> None:
        """Remove the lock file and unlock: a waiter locks the next file, or finds the entry."""
        if held.fd < 0:
            return
        with self._lock:
            if self._held.pop(held.fd, None) is None:
                return  # released already, or inherited across fork and forgotten
        try:
            os.unlink(held.path)
        except OSError as err:
            if err.errno != errno.ENOENT:
                logger.debug("codegen cache: cannot remove lock %s: %s", held.path, err)
        try:
            fcntl.flock(held.fd, fcntl.LOCK_UN)
        finally:
            os.close(held.fd)

    def held(self) -> list[str]:
        """Paths of the locks this process holds."""
        with self._lock:
            return [h.path for h in self._held.values()]
