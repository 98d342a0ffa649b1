"""diskcache stores that hold only str keys and bytes values, and never unpickle.

diskcache pickles anything that is not bytes/str/int/float and unpickles whatever rows of
mode PICKLE are in its database (CVE-2025-69872). `SafeDisk` refuses both directions, so a
hostile cache directory yields an error that the cache turns into a miss.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import diskcache

from ._errors import ArtifactError

__all__ = ["STORAGE_ERRORS", "ArtifactStore", "SafeDisk", "UnsafeEntryError"]

logger = logging.getLogger(__name__)


class UnsafeEntryError(ArtifactError):
    """A row in the store would need unpickling (written by something other than us)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, kind="store row")


# What the storage can raise; the cache turns each into a miss or a skipped store.
STORAGE_ERRORS = (sqlite3.Error, OSError, diskcache.Timeout)


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
        return super().fetch(mode, filename, value, read)


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
                self.directory.mkdir(parents=True, exist_ok=True)
                self._cache = diskcache.Cache(
                    str(self.directory),
                    timeout=self.timeout,
                    disk=SafeDisk,
                    size_limit=self.size_limit,
                    eviction_policy="least-recently-stored",  # no write on every hit
                    cull_limit=0,  # we cull after each put, to count what goes
                    statistics=False,
                )
                self._pid = os.getpid()
            return self._cache

    def get(self, key: str) -> bytes | None:
        """The bytes stored under `key`, or None."""
        return self._open().get(key, default=None, retry=False)

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
