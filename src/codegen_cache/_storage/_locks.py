"""Single-flight builds across processes: one OS lock per key, held only while building.

On Linux a builder locks one byte of `<dir>/locks/keys`, at an offset taken from the key's
hash, with an open-file-description lock (F_OFD_SETLK): the file is made once, so a miss
creates and removes no file (making one is most of what a lock file per key costs a miss:
docs/benchmarks.md at 5788f7c, "The hand-written parts against the library").
Such a lock belongs to this process's open description of the file, so the kernel drops it
when the holder dies, as a flock; threads of one process share the description, and a table
of the keys this process holds keeps them apart. Two keys share a byte (one then waits for the
other's build) with probability 2^-62.

A holder that is alive but stopped (SIGSTOP, Ctrl-Z, a debugger at a breakpoint, a paused
container) keeps its lock, so the kernel alone would make every waiter wait for it. The holder
of a byte also marks it with its process id (`_holders.py`); a waiter looks at that process four
times a second, says whom it waits for, and passes over one seen stopped for STOPPED_GRACE
seconds as it would a dead one (`acquire` answers that `Holder`; the caller builds under
another lock). Where no holder can be named (another pid namespace, another user's process,
the per-key files below) the waiter waits as for a running holder, up to its bound.

Elsewhere, or where the file system refuses those locks, a builder holds `flock(LOCK_EX)` on
`<dir>/locks/<key>` from its miss until its entry is written. The kernel drops the lock when the holder dies (kill -9, SIGTERM, os._exit), so no
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
import struct
import threading
import time
from pathlib import Path
from typing import NamedTuple

import xxhash

from .._forksafe import on_fork_child
from ._faults import FILE_MODE, ensure_dir, real_dir
from ._holders import STOPPED_GRACE, Holder, has_open, look, mark

__all__ = ["STOPPED_GRACE", "Held", "Holder", "KeyLocks"]

logger = logging.getLogger(__name__)

_FIRST_POLL, _MAX_POLL = 0.001, 0.01  # a wait ends within 10 ms of the holder's unlock
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)  # Linux 3.15+; None elsewhere
RANGES_FILE = "keys"
# struct flock (Linux): l_type, l_whence, l_start, l_len, l_pid (0 for an OFD lock), padding
_FLOCK = struct.Struct("hhqqi4x")
_BUSY = (errno.EAGAIN, errno.EACCES)
_LOOK_EVERY = 0.25  # how often a waiter looks at the holder
_SAY_AFTER = 10.0  # a wait this long is said at WARNING (once per holder), naming the holder


def _offset(key: str) -> int:
    return xxhash.xxh3_64_intdigest(key.encode()) >> 2


class Held(NamedTuple):
    """A lock this process holds: its descriptor and path (fd -1: building without a lock)."""

    fd: int
    path: str
    waited: float = 0.0
    key: str | None = None  # set for a byte of the shared file (OFD lock), None for a file of its own


class KeyLocks:
    """Per-key build locks in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = str(directory)
        self._root = os.path.dirname(self.directory)  # the cache directory: <dir>/locks
        self._real = False  # seen as a real directory (then not looked at again)
        self._held: dict[int, Held] = {}
        self._lock = threading.Lock()
        self._ranges = -1 if _OFD_SETLK is None else None  # fd of the shared file; None: not open yet
        self._busy: dict[str, int] = {}  # keys this process holds in the shared file -> its fd then
        self._retired: set[int] = set()  # fds of a shared file replaced while a key was held in it
        on_fork_child(self._forget_parent_locks)

    def _forget_parent_locks(self) -> None:
        # Close only: an unlock here would release the parent's build (the lock is shared).
        fds = {held.fd for held in self._held.values()} | set(self._busy.values()) | self._retired
        if self._ranges is not None and self._ranges >= 0:
            fds.add(self._ranges)
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._held = {}
        self._busy = {}
        self._retired = set()
        self._ranges = None if self._ranges != -1 else -1
        self._lock = threading.Lock()

    def acquire(self, key: str, *, wait: float) -> Held | Holder | None:
        """Lock `key`, waiting up to `wait` seconds for a live holder; None when the wait ran out.

        A Holder: the holder was seen stopped for STOPPED_GRACE seconds (not waited for further).
        A lock that cannot be taken at all (unwritable directory, a non-file planted at the
        path) gives a Held with fd -1: build without single-flight rather than block.
        """
        if self._ranges != -1:
            found = self._acquire_byte(key, wait)
            if found is not False:
                return found
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

    def _acquire_byte(self, key: str, wait: float) -> Held | Holder | None | bool:
        """Lock `key`'s byte of the shared file; False where that cannot be done (use a file per key)."""
        path = os.path.join(self.directory, RANGES_FILE)
        offset = _offset(key)
        start = time.monotonic()
        poll = _FIRST_POLL
        holder, next_look = None, start + _LOOK_EVERY
        while True:
            with self._lock:
                fd = self._ranges_fd(path)
                if fd < 0:
                    return False
                if key not in self._busy:
                    try:
                        fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
                    except OSError as err:
                        if err.errno not in _BUSY:
                            logger.debug("codegen cache: %s refuses byte locks (%s); a lock file per key instead",
                                         path, err)
                            self._retire(fd)
                            self._ranges = -1
                            return False
                    else:
                        self._busy[key] = fd
                        mark(fd, offset, fcntl.F_WRLCK)
                        return Held(fd, path, time.monotonic() - start, key)
            now = time.monotonic()
            if now >= next_look:
                next_look = now + _LOOK_EVERY
                found = look(fd, offset, holder, now)
                if found is not None and found is not holder:
                    logger.info("codegen cache: waiting for %s, which holds the build lock of %s",
                                found.describe(), key[:16])
                holder = found
                if holder is not None and not holder.said and time.time() - holder.since >= _SAY_AFTER:
                    holder.said = True
                    logger.warning("codegen cache: still waiting for %s, which holds the build lock of %s",
                                   holder.describe(), key[:16])
                if holder is not None and holder.stopped_since is not None \
                        and now - holder.stopped_since >= STOPPED_GRACE and has_open(holder.pid, fd):
                    return holder
            elapsed = now - start
            if elapsed >= wait:
                return None
            time.sleep(min(poll, wait - elapsed))
            poll = min(poll * 2, _MAX_POLL)

    def holder(self, key: str) -> Holder | None:
        """The process holding `key`'s lock as its marker names it, or None (not held, or not known)."""
        with self._lock:
            fd = self._ranges if self._ranges is not None and self._ranges >= 0 else -1
        return look(fd, _offset(key), None, time.monotonic()) if fd >= 0 else None

    def _ranges_fd(self, path: str) -> int:
        """The shared file's descriptor (made on first use; reopened if the file was replaced)."""
        fd = self._ranges
        if fd is not None and fd >= 0:
            if self._still_linked(fd, path):
                return fd
            self._retire(fd)  # the directory was removed or the file replaced: others use the new one
        fd = self._open(path)
        self._ranges = None if fd < 0 else fd  # unwritable now: try again on the next miss
        return fd

    def _retire(self, fd: int) -> None:
        if fd in self._busy.values():
            self._retired.add(fd)  # closed when its last key is released (a close would unlock it)
        else:
            try:
                os.close(fd)
            except OSError:
                pass
        if self._ranges == fd:
            self._ranges = None

    def _open(self, path: str) -> int:
        for attempt in (0, 1):
            try:
                if not self._real:
                    # A link at <dir>/locks would make the lock files elsewhere: refused (warned once).
                    self._real = real_dir(self.directory, self._root)
                    if not self._real:
                        raise FileNotFoundError(errno.ENOENT, "not made yet", self.directory)
                fd = os.open(path, _OPEN_FLAGS, FILE_MODE)
            except FileNotFoundError:
                if attempt:
                    return -1
                try:  # first use, or the directory was removed under us
                    ensure_dir(self.directory, self._root)
                    self._real = True
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
        """Unlock (a lock file of its own is removed first): a waiter locks it, or finds the entry."""
        if held.fd < 0:
            return
        if held.key is not None:
            with self._lock:
                if self._busy.get(held.key) != held.fd:
                    return  # released already, or inherited across fork and forgotten
                del self._busy[held.key]
                mark(held.fd, _offset(held.key), fcntl.F_UNLCK)
                try:
                    fcntl.fcntl(held.fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, _offset(held.key), 1, 0))
                except OSError as err:
                    logger.debug("codegen cache: cannot unlock %s of %s: %s", held.key[:16], held.path, err)
                if held.fd in self._retired and held.fd not in self._busy.values():
                    self._retired.discard(held.fd)
                    os.close(held.fd)
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
        """The locks this process holds: lock files, and `<dir>/keys#<key>` for bytes of the shared file."""
        with self._lock:
            return [h.path for h in self._held.values()] + [
                f"{os.path.join(self.directory, RANGES_FILE)}#{key}" for key in self._busy]
