"""The upgrade lock of a cache directory: `<dir>/upgrade/.lock`, an flock held by its one upgrader.

Whoever starts an upgrader takes the lock first and hands the locked descriptor down (_upgrade.py),
so at most one upgrader runs per directory and host. The lock's path must be a regular file:
anything else there (a symlink, a directory, a FIFO) would fail every open, which read as "an
upgrader holds it" once stopped every upgrade for good; it is moved aside instead, and where it
cannot be, `take_lock` says that no lock can be had, so that nobody waits for an upgrader that
never comes.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import time
from pathlib import Path

from .._log import warn_once
from .._storage._faults import FILE_MODE, real_dir

__all__ = ["HELD", "lock_path", "marker_dir", "take_lock", "wait_exited"]

logger = logging.getLogger(__name__)

_LOCK_NAME = ".lock"
HELD = -1  # take_lock: another upgrader holds the lock


def marker_dir(directory: Path) -> Path:
    """`<dir>/upgrade`: the entries waiting for their upgrade, and the lock."""
    return Path(directory) / "upgrade"


def lock_path(directory: Path) -> Path:
    """`<dir>/upgrade/.lock`."""
    return marker_dir(directory) / _LOCK_NAME


def take_lock(directory: Path) -> int | None:
    """The upgrade lock of `directory`, locked; HELD when an upgrader holds it; None when no lock
    can be had (no such directory, read-only, a link in the way): then no upgrader can run."""
    path = lock_path(directory)
    for attempt in (0, 1):
        try:
            real_dir(path.parent, directory)  # upgrade/ itself a link: refused (warned once)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, FILE_MODE)
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) and not attempt and _move_aside(path):
                continue
            logger.debug("codegen cache: cannot open the upgrade lock of %s: %s", directory, err)
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a socket planted there
            os.close(fd)
            if not attempt and _move_aside(path):
                continue
            return None
        break
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd < 3:  # stdin/stdout/stderr were closed: the launcher's would replace it
            fd, old = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3), fd
            os.close(old)
    except OSError:
        os.close(fd)
        return HELD
    return fd


def _move_aside(path: Path) -> bool:
    """Rename what is at the lock's path (not a regular file: a link, a directory) out of the way.

    Read as "an upgrader runs", it would stop every upgrade for good. Renamed, not removed: it
    is not the cache's; nothing it leads to is touched. True when the path is free now.
    """
    aside = path.with_name(f"{path.name}.not-a-lock-{os.getpid()}-{time.time_ns()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return True  # another process moved it first
    except OSError as err:
        warn_once(logger, ("upgrade-lock", str(path)), "codegen cache: %s is not a regular file and cannot be "
                  "moved aside (%s); llvm entries stay LLVM IR (slower hits, still correct) until it is removed",
                  path, err)
        return False
    warn_once(logger, ("upgrade-lock", str(path)), "codegen cache: %s was not a regular file (a link or a "
              "directory); moved aside to %s so that llvm upgrades go on", path, aside.name)
    return True


def wait_exited(directory: Path, timeout: float) -> bool:
    """Until no upgrader holds `directory`'s upgrade lock (or `timeout`); True when none does.

    For whoever removes a directory it made (a demo's temporary cache): an upgrader still
    running would write into it, or make it again.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(lock_path(directory), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return True  # no lock file: no upgrader ever ran here
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except OSError:
            pass
        finally:
            os.close(fd)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
