"""diskcache stores that hold only str keys and bytes values, and never unpickle.

diskcache pickles anything that is not bytes/str/int/float and unpickles whatever rows of
mode PICKLE are in its database (CVE-2025-69872). `SafeDisk` refuses both directions, so a
hostile cache directory yields an error that the cache turns into a miss.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import diskcache

from .._errors import ArtifactError
from ._faults import ReadOnlyStoreError, ReadOnlyView, share_file_mode, storage_fault, warn_read_only, writable

__all__ = [
    "STORAGE_ERRORS",
    "ArtifactStore",
    "ReadOnlyStoreError",
    "SafeDisk",
    "UnsafeEntryError",
    "share_file_mode",
    "storage_fault",
]

logger = logging.getLogger(__name__)


class UnsafeEntryError(ArtifactError):
    """A row in the store would need unpickling (written by something other than us)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, kind="store row")


# What the storage can raise; the cache turns each into a miss or a skipped store.
STORAGE_ERRORS = (sqlite3.Error, OSError, diskcache.Timeout)
# diskcache names value files <2 hex>/<2 hex>/<28 hex>.val; a row naming anything else was
# planted, and following it would read or delete files outside the store.
_VALUE_FILE = re.compile(r"^[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val$")
_DB_FILES = ("cache.db", "cache.db-wal", "cache.db-shm")
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26  # result codes (sqlite3 names them only from Python 3.11)


def _is_corrupt(err: sqlite3.DatabaseError) -> bool:
    """True when SQLite says the database file itself is damaged (not locked, full or read-only)."""
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(err).lower()
    return "malformed" in text or "not a database" in text


class SafeDisk(diskcache.Disk):
    """A diskcache Disk that stores and returns only bytes (values) and str (keys)."""

    def put(self, key):
        if type(key) is not str:
            raise TypeError(f"store keys must be str, got {type(key).__name__}")
        return super().put(key)

    def get(self, key, raw):
        if not raw:
            raise UnsafeEntryError("refusing to unpickle a key read from the cache database")
        return super().get(key, raw)

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if type(value) is not bytes:
            raise TypeError(f"store values must be bytes, got {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode, filename, value, read):
        if mode != diskcache.core.MODE_RAW and mode != diskcache.core.MODE_BINARY:
            raise UnsafeEntryError(f"refusing to read a cache row of mode {mode} (only bytes are stored)")
        if mode == diskcache.core.MODE_BINARY and not _VALUE_FILE.match(str(filename)):
            raise UnsafeEntryError(f"refusing to read value file {str(filename)[:80]!r} (not a store file name)")
        return super().fetch(mode, filename, value, read)

    def remove(self, file_path):
        # diskcache removes the file a row names when the row goes (delete, cull, clear):
        # a planted '../../x' must not delete files outside the store.
        if not _VALUE_FILE.match(str(file_path)):
            logger.warning("codegen cache: not removing %r named by a store row (not a store file name)",
                           str(file_path)[:200])
            return
        super().remove(file_path)

    def _write(self, full_path, iterator, mode, encoding=None):
        # diskcache leaves a partly written value file behind when the write fails (a full
        # disk): no row refers to it, so it would hold that space for good. Remove it.
        existed = os.path.exists(full_path)
        if isinstance(iterator, io.BytesIO):
            # diskcache iterates a BytesIO line by line: thousands of write() calls for a
            # binary. Hand it over as one chunk (same file, same size).
            iterator = iter((iterator.getvalue(),))
        try:
            size = super()._write(full_path, iterator, mode, encoding)
        except OSError:
            if not existed:
                with contextlib.suppress(OSError):
                    os.remove(full_path)
            raise
        subdir = os.path.dirname(full_path)
        for path in (full_path, subdir, os.path.dirname(subdir)):
            share_file_mode(path)
        return size


class ArtifactStore:
    """One diskcache store (e.g. <dir>/compiled) of framed artifacts, opened lazily."""

    def __init__(self, directory: Path, *, size_limit: int, timeout: float = 2.0,
                 on_evict: Callable[[int], None] | None = None) -> None:
        self.directory = Path(directory)
        self.size_limit = size_limit
        self.timeout = timeout
        self.on_evict = on_evict
        self._cache: diskcache.Cache | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def _open(self) -> diskcache.Cache:
        # A diskcache connection must not cross fork(); reopen in a child process.
        cache = self._cache
        if cache is not None and self._pid == os.getpid():
            return cache
        with self._lock:
            if self._cache is None or self._pid != os.getpid():
                if not writable(self.directory):
                    self._cache = ReadOnlyView(self.directory, SafeDisk(str(self.directory)))  # type: ignore[assignment]
                    self._pid = os.getpid()
                    warn_read_only(self.directory.parent)
                    return self._cache
                # The cache directory too, when this call makes it (an existing one is left as it is).
                made_root = not self.directory.parent.exists()
                self.directory.mkdir(parents=True, exist_ok=True)
                try:
                    self._cache = self._connect()
                except sqlite3.DatabaseError as err:
                    if not _is_corrupt(err):
                        raise
                    self._start_afresh(err)
                    self.directory.mkdir(parents=True, exist_ok=True)
                    self._cache = self._connect()
                self._pid = os.getpid()
                for path in (*((self.directory.parent,) if made_root else ()), self.directory,
                             *(self.directory / n for n in _DB_FILES)):
                    share_file_mode(path)
            return self._cache

    def _connect(self) -> diskcache.Cache:
        return diskcache.Cache(
            str(self.directory),
            timeout=self.timeout,
            disk=SafeDisk,
            size_limit=self.size_limit,
            eviction_policy="least-recently-stored",  # no write on every hit
            cull_limit=0,  # we cull after each put, to count what goes
            statistics=False,
        )

    def _start_afresh(self, err: sqlite3.DatabaseError) -> None:
        # The index is damaged (not a database, malformed): none of its entries can be found
        # again, and every process would fail on it for good. Move the whole store aside (one
        # atomic rename: a racing process sees the old store or none, never half of each), then
        # delete it; the caller opens an empty store in its place.
        logger.warning("codegen cache: the index of %s is corrupt (%s); starting that store afresh",
                       self.directory, err)
        if self._cache is not None:
            with contextlib.suppress(*STORAGE_ERRORS):
                self._cache.close()
        self._cache = None
        aside = self.directory.with_name(f".{self.directory.name}.corrupt-{os.getpid()}-{time.time_ns()}")
        try:
            os.rename(self.directory, aside)
        except OSError:
            return  # another process moved it first
        shutil.rmtree(aside, ignore_errors=True)

    def _checked(self, func, *args, **kwargs):
        # A store can also turn out damaged after it opened: start afresh, then fail this call
        # (the cache counts it as a miss or a skipped store); the next call opens the new store.
        try:
            return func(*args, **kwargs)
        except sqlite3.DatabaseError as err:
            if _is_corrupt(err) and not isinstance(self._cache, ReadOnlyView):
                with self._lock:
                    self._start_afresh(err)
            raise

    @property
    def read_only(self) -> bool:
        """True when the store's directory cannot be written: reads work, writes raise."""
        return isinstance(self._open(), ReadOnlyView)

    def get(self, key: str) -> bytes | None:
        """The bytes stored under `key`, or None."""
        return self._checked(lambda: self._open().get(key, default=None, retry=False))

    def put(self, key: str, blob: bytes, *, expire: float | None = None, tag: str | None = None) -> bool:
        """Store `blob` under `key` (atomic for readers), then evict to the size limit."""
        cache = self._open()
        stored = bool(cache.set(key, blob, expire=expire, tag=tag, retry=False))
        if cache.volume() > self.size_limit:
            evicted = int(cache.cull(retry=False))
            if evicted and self.on_evict is not None:
                self.on_evict(evicted)
        return stored

    def add(self, key: str, blob: bytes, *, expire: float | None = None) -> bool:
        """Store `blob` only if `key` is absent; True when this call stored it."""
        return bool(self._open().add(key, blob, expire=expire, retry=False))

    def delete(self, key: str) -> bool:
        """Remove `key`; True when it was there."""
        return bool(self._open().delete(key, retry=False))

    def keys(self) -> Iterator[str]:
        """Every key in the store."""
        return iter(self._open())

    def __len__(self) -> int:
        return len(self._open())

    def volume(self) -> int:
        """Bytes on disk (database plus value files)."""
        return int(self._open().volume())

    def expire(self) -> int:
        """Drop expired entries; how many went."""
        return int(self._open().expire(retry=False))

    def clear(self) -> int:
        """Remove every entry; how many went."""
        return int(self._open().clear(retry=False))

    def cull(self) -> int:
        """Evict entries until the store fits its size limit."""
        return int(self._open().cull(retry=False))

    def close(self) -> None:
        """Close the database connection of this process."""
        with self._lock:
            if self._cache is not None and self._pid == os.getpid():
                self._cache.close()
            self._cache = None
