"""How the stores meet a failing or unwritable filesystem.

- `storage_fault` names the faults that fail many operations at once (no space, read-only),
  so the cache warns once per fault rather than once per operation;
- `share_file_mode` keeps a shared (team) cache writable by its group and never by the world;
  `freeze_file_mode` makes an entry file read-only once written;
- `ensure_dir` makes the cache's own directories and refuses a symlink in their place;
- `READ_FLAGS` and `read_whole` read a file the cache made without following a symlink, blocking
  on a FIFO, or reading past a bound.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
from pathlib import Path

from .._errors import CacheLinkError, ReadOnlyStoreError
from .._log import warn_once

__all__ = ["DIR_MODE", "FILE_MODE", "READ_FLAGS", "ReadOnlyStoreError", "ensure_dir", "freeze_file_mode", "real_dir", "read_whole", "share_file_mode", "storage_fault", "warn_read_only", "writable"]

logger = logging.getLogger(__name__)

# Opening an entry file: a symlink fails (ELOOP), a FIFO opens without blocking (read_whole refuses it).
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_whole(fd: int, max_bytes: int) -> bytes | None:
    """All of the regular file open on `fd`; None when it is not a regular file, holds more than
    `max_bytes`, or changed size while read (one byte past its size is asked for, so growth is seen)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
        return None
    chunks, left = [], info.st_size + 1
    while left > 0:
        chunk = os.read(fd, min(left, 16 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    return data if len(data) == info.st_size else None


# SQLite result codes (sqlite3 names them only from Python 3.11).
_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_FULL, _SQLITE_CANTOPEN = 8, 10, 13, 14


def storage_fault(err: BaseException, directory: str | os.PathLike[str] | None = None) -> str | None:
    """'no-space' or 'read-only' when a storage error is one of those, else None.

    With `directory`, SQLite's vaguer errors are told apart: "disk I/O error" is no-space when
    the filesystem is full (a WAL database's -shm cannot grow), "unable to open database file"
    is read-only when the directory cannot be written.
    """
    if isinstance(err, OSError):
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            return "no-space"
        if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return "read-only"
    if isinstance(err, sqlite3.Error):
        code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+; may be an extended code
        code = None if code is None else code & 0xFF
        text = str(err).lower()
        if code == _SQLITE_FULL or "disk is full" in text:
            return "no-space"
        if code == _SQLITE_READONLY or "readonly database" in text:
            return "read-only"
        if (code == _SQLITE_IOERR or "disk i/o error" in text) and directory is not None and _full(directory):
            return "no-space"
        if (code == _SQLITE_CANTOPEN or "unable to open" in text) and directory is not None \
                and not writable(Path(directory)):
            return "read-only"
    return None


def _full(directory: str | os.PathLike[str]) -> bool:
    path = os.fspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        vfs = os.statvfs(path)
    except OSError:
        return False
    return vfs.f_blocks > 0 and vfs.f_bavail * vfs.f_frsize < (1 << 20)


def share_file_mode(path: str | os.PathLike[str]) -> None:
    """Give a file we own the group-write bit of its directory, and never world-write.

    SQLite creates databases 0644 whatever the umask, so in a group-writable (team) directory
    the second user could not write them; value files and directories follow the umask,
    which could make them world-writable (umask 000).
    """
    try:
        info = os.stat(path)
        if info.st_uid != os.geteuid():
            return
        mode = stat.S_IMODE(info.st_mode)
        if mode & stat.S_ISVTX:
            return  # a sticky directory (/tmp-like) is meant to be shared: not ours to narrow
        wanted = mode & ~stat.S_IWOTH
        if stat.S_ISREG(info.st_mode) and os.stat(os.path.dirname(os.path.abspath(path))).st_mode & stat.S_IWGRP:
            wanted |= stat.S_IWGRP | stat.S_IRGRP
        if wanted != mode:
            os.chmod(path, wanted)
    except OSError:
        pass  # gone, or not ours to change: leave it


def freeze_file_mode(file: int | str | os.PathLike[str]) -> None:
    """Drop every write bit of an entry file this process made (its descriptor, or its path).

    An entry is never changed in place (a rebuild writes a new file and renames it over), so
    nothing needs to write it again; a stray writer (`cp` over it, an editor, a tool of another
    team member) gets EACCES instead of changing what the next hit reads. A hit loads its own
    checked copy of the bytes anyway (_artifacts/_private.py).
    """
    try:
        mode = stat.S_IMODE(os.stat(file).st_mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        os.chmod(file, mode)  # an int is a descriptor: fchmod
    except OSError:
        pass  # a filesystem without modes: the entry is still checked on every read


def warn_read_only(root: Path) -> None:
    """Warn once per cache directory and process (its stores open read-only together)."""
    # The key is the cache's StorageGuard's too: one warning for the directory, whoever sees it first.
    warn_once(logger, ("read-only", str(root)), "codegen cache: %s cannot be written (read-only mount or no "
              "permission); serving the entries it has and storing nothing new", root)


# Modes the cache creates files and directories with (the umask narrows them): readable and
# writable by the group for a team cache (umask 002), never by the world.
FILE_MODE, DIR_MODE = 0o660, 0o770


def ensure_dir(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
               make_root: bool = True) -> None:
    """Create `path` as a real directory; OSError if something else (a symlink, a file) is there.

    The cache writes only below directories it made: a symlink planted at `<dir>/locks` or
    `<dir>/pending` must not send its files (or its deletes, or its reads) elsewhere. With
    `root`, the cache directory `path` lies in, every directory from below `root` down to `path`
    is checked (a symlink anywhere there is refused, with one warning); `root` itself may be a
    symlink (where the user keeps the cache is the user's choice). make_root=False: a missing
    `root` is not made (FileNotFoundError): a helper process must not bring back a cache
    directory that was removed.
    """
    path = os.fspath(path)
    if root is not None:
        root = os.fspath(root)
        if not os.path.isdir(root):
            if not make_root:
                raise FileNotFoundError(errno.ENOENT, "the cache directory is gone", root)
            ensure_dir(root)
        for part in _below(root, path):
            _make_real(part)
        return
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if parent and parent != path:
            ensure_dir(parent)
    _make_real(path, warn=False)  # a directory outside any cache: refused, not warned about here


def real_dir(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """Whether `path` (below the cache directory `root`) is there as a real directory all the way
    down from `root`; False when it is missing; OSError (warned once) where a symlink or a file is
    in its place. For reads: nothing is made."""
    for part in _below(os.fspath(root), os.fspath(path)):
        try:
            info = os.lstat(part)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(info.st_mode):
            _refuse(part)
    return True


def _below(root: str, path: str) -> list[str]:
    """The directories from the one below `root` down to `path` (ValueError when not below it)."""
    relative = os.path.relpath(path, root)
    if relative == "." or relative.startswith(".."):
        raise ValueError(f"{path} is not below the cache directory {root}")
    parts, current = [], root
    for name in relative.split(os.sep):
        current = os.path.join(current, name)
        parts.append(current)
    return parts


def _make_real(path: str, *, warn: bool = True) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            pass
        info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        if not warn:
            raise CacheLinkError(path)
        _refuse(path)


def _refuse(path: str) -> None:
    warn_once(logger, ("not-a-dir", path), "codegen cache: %s is a symbolic link or not a directory; the cache "
              "never follows a link inside its directory, so it goes on without that part (remove it to "
              "use it again)", path)
    raise CacheLinkError(path)


def writable(directory: Path) -> bool:
    """Whether a store can be opened for writing (checks the nearest existing ancestor)."""
    existing = directory
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        return False
    db = directory / "cache.db"
    return not db.exists() or os.access(db, os.R_OK | os.W_OK)
