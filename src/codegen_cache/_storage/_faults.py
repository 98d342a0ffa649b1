"""How the stores meet a failing or unwritable filesystem.

- `storage_fault` names the faults that fail many operations at once (no space, read-only),
  so the cache warns once per fault rather than once per operation;
- `share_file_mode` keeps a shared (team) cache writable by its group and never by the world;
- `ReadOnlyView` serves the rows of a store whose directory cannot be written, which
  diskcache itself cannot open.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import diskcache

__all__ = ["ReadOnlyStoreError", "ReadOnlyView", "share_file_mode", "storage_fault", "warn_read_only", "writable"]

logger = logging.getLogger(__name__)

# SQLite result codes (sqlite3 names them only from Python 3.11).
_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_FULL, _SQLITE_CANTOPEN = 8, 10, 13, 14


class ReadOnlyStoreError(OSError):
    """A write to a store whose directory cannot be written (read-only mount, no permission)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(errno.EROFS, "cache store is read-only", str(directory))


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


_warned: set[Path] = set()


def warn_read_only(root: Path) -> None:
    """Warn once per cache directory and process (its four stores open read-only together)."""
    if root not in _warned:
        _warned.add(root)
        logger.warning("codegen cache: %s cannot be written (read-only mount or no permission); "
                       "serving the entries it has and storing nothing new", root)


def writable(directory: Path) -> bool:
    """Whether a store can be opened for writing (checks the nearest existing ancestor)."""
    existing = directory
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        return False
    db = directory / "cache.db"
    return not db.exists() or os.access(db, os.R_OK | os.W_OK)


class ReadOnlyView:
    """The read side of a diskcache store in a directory that cannot be written.

    diskcache itself cannot open one (it writes its settings on open, and a WAL database
    needs its -shm file), so rows are read with SQLite in read-only mode, through SafeDisk's
    checks; every write raises ReadOnlyStoreError, which the cache turns into a skipped store.
    """

    def __init__(self, directory: Path, disk: diskcache.Disk) -> None:
        self.directory = directory
        self._disk = disk  # the store's SafeDisk: its checks apply to every row read here
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        db = directory / "cache.db"
        if db.exists():
            try:
                self._conn = self._connect(db, immutable=False)
            except sqlite3.Error:
                # A WAL database on read-only media without its -shm file opens only as
                # immutable (SQLite then skips locking: entries are still checksummed).
                self._conn = self._connect(db, immutable=True)

    @staticmethod
    def _connect(db: Path, *, immutable: bool) -> sqlite3.Connection:
        uri = f"{db.absolute().as_uri()}?mode=ro" + ("&immutable=1" if immutable else "")
        conn = sqlite3.connect(uri, uri=True, timeout=2.0, check_same_thread=False)
        conn.execute("SELECT COUNT(*) FROM Cache").fetchone()
        return conn

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        if self._conn is None:
            return []
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def get(self, key: str, default=None, retry: bool = False):
        rows = self._query("SELECT mode, filename, value, expire_time FROM Cache WHERE key = ? AND raw = 1", (key,))
        if not rows:
            return default
        mode, filename, value, expire_time = rows[0]
        if expire_time is not None and expire_time < time.time():
            return default
        try:
            return self._disk.fetch(mode, filename, value, False)
        except FileNotFoundError:
            return default

    def __iter__(self) -> Iterator[str]:
        for key, raw in self._query("SELECT key, raw FROM Cache ORDER BY rowid"):
            yield self._disk.get(key, raw)

    def __len__(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM Cache")[0][0]) if self._conn is not None else 0

    def volume(self) -> int:
        return int(self._query("SELECT COALESCE(SUM(size), 0) FROM Cache")[0][0]) if self._conn is not None else 0

    def _refuse(self, *args, **kwargs):
        raise ReadOnlyStoreError(self.directory)

    set = add = delete = expire = clear = cull = _refuse

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
