"""The read side of a diskcache store in a directory that cannot be written."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ._faults import ReadOnlyStoreError

if TYPE_CHECKING:
    import diskcache

__all__ = ["ReadOnlyView"]


class ReadOnlyView:
    """The read side of a diskcache store in a directory that cannot be written.

    diskcache itself cannot open one (it writes its settings on open, and a WAL database
    needs its -shm file), so rows are read with SQLite in read-only mode, through SafeDisk's
    checks; every write raises ReadOnlyStoreError, which the cache turns into a skipped store.
    """

    def __init__(self, directory: Path, disk: diskcache.Disk, *, writable_dir: bool = False) -> None:
        self.directory = directory
        self._disk = disk  # the store's SafeDisk: its checks apply to every row read here
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        db = directory / "cache.db"
        if db.exists():
            # Read-only by choice in a directory it could write: SQLite would make the -shm and -wal
            # files of a WAL database. With no -shm there, no writer has the store open now: opened
            # immutable, writing nothing (a row a writer adds later may be missed: a miss).
            chosen = writable_dir and not (directory / "cache.db-shm").exists()
            try:
                self._conn = self._connect(db, immutable=chosen)
            except sqlite3.Error:
                if chosen:
                    raise
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
