"""Who holds a key's byte lock, and whether it is stopped: what a waiter needs to pass over a stopped holder.

An OFD lock (F_OFD_SETLK) names no process: F_OFD_GETLK answers pid -1. So the holder of a
key's byte also takes a classic POSIX lock on the key's marker byte (its offset plus 2^62, a
range no key's byte uses), and F_GETLK on it answers the holder's process id in the waiter's
pid namespace (0 for a process outside it). Classic locks belong to the process: they are not
inherited by fork and are dropped when the process closes any descriptor of the file, so the
marker only names the holder; the OFD lock alone keeps builds apart.

A holder counts as stopped (SIGSTOP, Ctrl-Z, a debugger at a breakpoint, a paused container)
when /proc/<pid>/stat shows state T or t at every look and no CPU time used since the first:
a process traced by strace passes through t at each system call, and uses CPU time. Before it
is passed over, the waiter checks that the process has this lock file open (/proc/<pid>/fd), so
a marker of a reused pid, or of a host sharing the file system, names nobody. Linux only: where
/proc cannot be read, nobody is passed over.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass

__all__ = ["STOPPED_GRACE", "Holder", "has_open", "look", "mark"]

logger = logging.getLogger(__name__)

# A holder seen stopped at every look for this long is passed over (docs/cache.md, "Single-flight").
STOPPED_GRACE = 3.0
_MARK = 1 << 62  # marker byte of a key: its offset plus this (offsets are below 2^62)
# struct flock (Linux): l_type, l_whence, l_start, l_len, l_pid, padding
_FLOCK = struct.Struct("hhqqi4x")
_HOST = socket.gethostname()


@dataclass(slots=True)
class Holder:
    """The process holding a key's lock, as a waiter sees it: pid, host, since when it was seen holding it.

    stopped_since: since when it has been seen stopped (time.monotonic(); None: running).
    """

    pid: int
    host: str
    since: float  # time.time() of the first look that found it holding the lock
    stopped_since: float | None = None
    cpu: int = -1  # its CPU ticks when first seen stopped: a stopped process uses none
    said: bool = False  # the long wait for it was said at WARNING

    def describe(self) -> str:
        """'process 123 on host-a (seen holding it since 10:02:03)', for log lines."""
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"process {self.pid} on {self.host} (seen holding it since {since})"


def _process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, CPU ticks) of a process from /proc/<pid>/stat, or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the name may hold spaces and parentheses
    try:
        return fields[0], int(fields[11]) + int(fields[12])  # state, utime + stime
    except (IndexError, ValueError):
        return None


def has_open(pid: int, fd: int) -> bool:
    """Whether process `pid` has the file of our descriptor `fd` open (so its marker is about this file)."""
    try:
        mine = os.fstat(fd)
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                there = os.stat(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                return True
    except OSError:
        pass  # another user's process, or gone: not known to hold it
    return False


def mark(fd: int, offset: int, kind: int) -> None:
    """Set (F_WRLCK) or clear (F_UNLCK) this process's marker of the key at `offset`."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETLK, _FLOCK.pack(kind, os.SEEK_SET, _MARK + offset, 1, 0))
    except OSError as err:
        logger.debug("codegen cache: cannot mark the holder of a lock byte (%s); waiters cannot name it", err)


def look(fd: int, offset: int, seen: Holder | None, now: float) -> Holder | None:
    """The holder of the key at `offset` (by its marker) and whether it is stopped, carried on from `seen`."""
    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, _MARK + offset, 1, 0))
    except OSError:
        return None
    kind, _whence, _start, _len, pid = _FLOCK.unpack(answer)
    if kind == fcntl.F_UNLCK or pid <= 0:
        return None  # not marked (yet, or any more), or a process of another pid namespace
    if seen is None or seen.pid != pid:
        seen = Holder(pid, _HOST, time.time())
    state = _process_state(pid)
    if state is None or state[0] not in "Tt":
        seen.stopped_since, seen.cpu = None, -1
    elif seen.stopped_since is None or state[1] != seen.cpu:
        seen.stopped_since, seen.cpu = now, state[1]  # stopped now (or it ran meanwhile): count from here
    return seen
