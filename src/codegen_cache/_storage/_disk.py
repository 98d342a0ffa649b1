"""A cache directory's stores: str keys, bytes values, never unpickled.

A store is a diskcache `Cache` whose Disk (`_safedisk.SafeDisk`) stores and returns only
bytes. Reads go through `ArtifactStore.read`, which looks the row up itself through its own
SQLite connection (the columns of diskcache's `Cache` table; diskcache is pinned to 5.6.x for
that and for `SafeDisk._write`, and tests/test_private_internals.py fails when either changes)
so that a value file is opened without following symlinks, must be a regular file, and is read
no further than the size its row recorded. diskcache itself is imported where a store is first
opened through it (a write, an eviction, a clear, a read-only directory): never by a lookup.

Every value lives in a value file of its own, and a store keeps beside its rows a *key file*
per entry, `<store>/keys/<key>`: the name and size of the key's value file. A lookup reads the
key file and the value file it names, without SQLite: a process's first lookup would otherwise
open the database, parse its schema and make its write-ahead log, most of a warm compile's
storage work (docs/benchmarks.md at 5788f7c, "Lookups without SQLite"). The rows stay what is stored: a
key file is written after its row (by whoever stored it), names only a value file of the
store's own form, read under the size it names, and one that leads nowhere (the entry was
evicted, replaced or removed) sends the lookup to the row. What a value file holds is checked
by the reader as any row's value is (its frame names its key and its checksum). A delete, an
eviction or a clear removes key files with their rows; those a killed process left go at every
expire (`codegen-cache prune`).

Eviction is least recently used (`evict`, `_eviction.py`): hits mark their rows used in
batches (`_usage.py`, `mark_used`), and a put that takes the store over its size limit removes
the rows used longest ago. Sizes are counted as `du` counts them (`footprint`): the index, and
each entry's value file, key file and directory in whole blocks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .._artifacts import SCRATCH_PREFIX
from .._errors import ArtifactError, UnsafeEntryError
from .._forksafe import on_fork_child, sqlite_gate
from ._faults import (READ_FLAGS, ReadOnlyStoreError, ensure_dir, freeze_file_mode, read_whole, real_dir,
                      share_file_mode, storage_fault, warn_read_only, writable)
from ._eviction import BLOCK, ENTRY_OVERHEAD, GROUP_TAG, evict_least_used
from ._fsprobe import on_block_device, sweep_leftovers, warn_if_unsafe
from ._readonly import ReadOnlyView
from ._values import VALUE_FILE, file_size, read_value_file

if TYPE_CHECKING:
    import diskcache

__all__ = ["BLOCK", "GROUP_TAG", "KEYS_DIR", "STORAGE_ERRORS", "ArtifactStore", "Row", "storage_fault"]

logger = logging.getLogger(__name__)

# What the storage can raise; the cache turns each into a miss or a skipped store. diskcache's
# Timeout (a write that found the store locked past its timeout) is raised as TimeoutError.
STORAGE_ERRORS = (sqlite3.Error, OSError)
# The modes of diskcache's rows that hold bytes: raw in the row, or in a value file.
_MODE_RAW, _MODE_BINARY = 1, 2
_DB_FILES = ("cache.db", "cache.db-wal", "cache.db-shm")
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26  # result codes (sqlite3 names them only from Python 3.11)
_SELECT = ("SELECT mode, filename, value, size FROM Cache WHERE key = ? AND raw = 1 "
           "AND (expire_time IS NULL OR expire_time > ?)")
KEYS_DIR = "keys"  # <store>/keys/<key>: the key files
# Keys that get a key file: the cache's digests (any other key is looked up in the rows only).
_KEY_FILE_NAME = re.compile(r"^[0-9a-f]{16,64}$")
_KEY_FILE_MAX = 128  # "<value file name>\n<size>\n" is under 60 bytes
_FOOTPRINT = (f"SELECT COALESCE(SUM((size + {BLOCK - 1}) / {BLOCK} * {BLOCK}), 0) + COUNT(*) * {ENTRY_OVERHEAD} "
              "FROM Cache")
_BY_USE = "SELECT key, size, tag, access_time FROM Cache WHERE raw = 1 ORDER BY access_time, rowid"
_MARK = ("UPDATE Cache SET access_time = ?, access_count = access_count + 1 "
         "WHERE key = ? AND raw = 1 AND access_time < ?")
_BY_USE_INDEX = "CREATE INDEX IF NOT EXISTS Cache_access_time ON Cache (access_time)"


def _is_corrupt(err: sqlite3.DatabaseError) -> bool:
    """True when SQLite says the database file itself is damaged (not locked, full or read-only)."""
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(err).lower()
    return "malformed" in text or "not a database" in text


def _lock_timeout() -> type[BaseException] | tuple[()]:
    """diskcache's Timeout where a store was opened through it, else nothing to catch: no other
    code raises it. Named only where an exception is being matched, so a lookup imports none of it."""
    safedisk = sys.modules.get(f"{__package__}._safedisk")
    return safedisk.Timeout if safedisk is not None else ()


def _set_over(cache: diskcache.Cache, key: str, blob: bytes, over: Callable[[bytes | None], bool],
              expire: float | None, tag: str | None) -> bool:
    with cache.transact(retry=False):  # holds the store's write lock: reads go on, writes wait
        return over(cache.get(key)) and bool(cache.set(key, blob, expire=expire, tag=tag, retry=False))


class Row(NamedTuple):
    """A stored value and, when it lives in a file of its own, that file (for tools; never loaded by path)."""

    blob: bytes
    path: str | None


_probed: set[str] = set()


def check_filesystem(root: Path) -> None:
    """Warn once per cache directory and process where SQLite is not safe (NFS, SMB, FUSE).

    Done where a store's SQLite is first opened, not when the cache object is made: a process
    that never opens one (tilelang's whole-kernel entries are plain files) does not read the
    mount table.
    """
    name = os.fspath(root)
    if name not in _probed:
        _probed.add(name)
        if not on_block_device(name):  # a local disk filesystem: no mount table to read
            warn_if_unsafe(root)


class ArtifactStore:
    """One diskcache store (e.g. <dir>/compiled) of framed artifacts, opened lazily."""

    def __init__(self, directory: Path, *, size_limit: int, timeout: float = 2.0,
                 on_evict: Callable[[int], None] | None = None, make_root: bool = True,
                 along: Callable[[bytes], None] | None = None, read_only: bool = False) -> None:
        self.directory = Path(directory)
        # Every store lives directly in its cache directory; make_root=False: a helper process
        # never makes that directory again once it was removed.
        self.root, self.make_root = self.directory.parent, make_root
        self.size_limit = size_limit
        self.timeout = timeout
        self.on_evict = on_evict
        self.along = along  # what goes with an evicted GROUP_TAG entry (the cache's stores)
        # True: opened as a read-only directory is (ReadOnlyView), without its warning: asked for.
        self.forced_read_only = read_only
        self._reset()
        on_fork_child(self._reset)

    def _reset(self) -> None:
        # Also in a child of fork: a diskcache connection must not cross it (diskcache would
        # close the parent's; we drop ours and open anew).
        self._cache: diskcache.Cache | ReadOnlyView | None = None
        self._db_id: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()
        self._keys_dir: str | None = None  # <store>/keys once looked at ("": not a real directory)
        self._measured: tuple[int, int, int] | None = None  # (volume, count, footprint) at the last count

    def _read_row(self, key: str) -> tuple | None:
        """The row of `key`, read through a plain SQLite connection of this store's own.

        Opening a diskcache store writes its settings, closes and reopens its connection
        (docs/benchmarks.md at 5788f7c), and the first lookup of a process would pay for it. A lookup needs
        none of that: a plain SQLite connection reads the same table, and opens nothing that is
        not there (a store not made yet is a miss, not made here). It is used also once
        diskcache's store is open: as fast as diskcache's private `_sql` (docs/maintaining.md,
        "What each one buys"), and one way to read.
        """
        found = self._plain_row(key)
        if found is not self._DAMAGED:
            return found
        # A damaged index: diskcache's open starts the store afresh.
        if isinstance(self._open(), ReadOnlyView):
            return self._UNREADABLE
        found = self._plain_row(key)
        return None if found is self._DAMAGED else found

    def _connection(self) -> sqlite3.Connection | tuple | None:
        """This process's plain SQLite connection to the store; None: no store yet; _UNREADABLE: read-only."""
        reader = self._reader
        if reader is None:
            db = self.directory / "cache.db"
            if not db.exists():
                return None  # no store yet: nothing stored
            if self.forced_read_only or not writable(self.directory):
                return self._UNREADABLE  # a read-only directory: ReadOnlyView reads it
            with self._reader_lock:
                if self._reader is None:
                    real_dir(self.directory, self.root)  # never through a link (one check per process)
                    check_filesystem(self.root)
                    self._reader = self._run(sqlite3.connect, f"{db.absolute().as_uri()}?mode=rw", uri=True,
                                             timeout=self.timeout, check_same_thread=False, isolation_level=None)
                reader = self._reader
        return reader

    def _plain_row(self, key: str) -> tuple | None:
        reader = self._connection()
        if reader is None or reader is self._UNREADABLE:
            return reader  # type: ignore[return-value]
        with self._reader_lock:
            try:
                return self._run(lambda: reader.execute(_SELECT, (key, time.time())).fetchone())
            except sqlite3.Error as err:
                if isinstance(err, sqlite3.OperationalError) and "no such table" in str(err):
                    # Another thread or process is making the store: its file is there before its
                    # table. Nothing is stored yet, so this is a miss, and the connection stays.
                    return None
                # Damaged, or replaced under us (a store started afresh): the next lookup opens again.
                self._reader = None
                with contextlib.suppress(sqlite3.Error):
                    reader.close()
                if not (isinstance(err, sqlite3.DatabaseError) and _is_corrupt(err)):
                    raise
        return self._DAMAGED  # _run started a store this process had open afresh

    _UNREADABLE = ("unreadable",)
    _DAMAGED = ("damaged",)

    def _open(self) -> diskcache.Cache | ReadOnlyView:
        cache = self._cache
        if cache is not None:
            return cache
        with self._lock:
            if self._cache is None:
                self._cache = self._open_locked()
            return self._cache

    def _open_locked(self) -> diskcache.Cache | ReadOnlyView:
        check_filesystem(self.root)
        if self.forced_read_only or not writable(self.directory):
            real_dir(self.directory, self.root)  # a symlink in its place is refused here too
            if not self.forced_read_only:
                warn_read_only(self.root)
            from ._safedisk import SafeDisk

            return ReadOnlyView(self.directory, SafeDisk(str(self.directory)),
                                writable_dir=self.forced_read_only and writable(self.directory))
        # The cache directory too, when this call makes it (an existing one is left as it is).
        made_root = not self.root.exists()
        ensure_dir(self.directory, self.root, make_root=self.make_root)
        with sqlite_gate:
            try:
                cache = self._connect()
            except sqlite3.DatabaseError as err:
                if not _is_corrupt(err):
                    raise
                self._start_afresh(err)
                ensure_dir(self.directory, self.root, make_root=self.make_root)
                cache = self._connect()
        for path in (*((self.directory.parent,) if made_root else ()), self.directory,
                     *(self.directory / n for n in _DB_FILES)):
            share_file_mode(path)
        self._db_id = self._db_identity()
        # Eviction reads rows by last use: the index diskcache itself keeps under its LRU policy.
        # Made here, not by that policy, whose get() writes each row it reads.
        reader = self._connection()
        if isinstance(reader, sqlite3.Connection):
            with self._reader_lock, contextlib.suppress(sqlite3.Error):
                self._run(reader.execute, _BY_USE_INDEX)
        return cache

    def _connect(self) -> diskcache.Cache:
        from ._safedisk import open_cache

        return open_cache(str(self.directory), timeout=self.timeout, size_limit=self.size_limit)

    def _db_identity(self) -> tuple[int, int] | None:
        try:
            info = os.stat(self.directory / "cache.db")
        except OSError:
            return None
        return info.st_dev, info.st_ino

    def _start_afresh(self, err: sqlite3.DatabaseError) -> None:
        # The index is damaged (not a database, malformed): none of its entries can be found
        # again, and every process would fail on it for good. Move the whole store aside (one
        # atomic rename: a racing process sees the old store or none, never half of each), then
        # delete it; the caller opens an empty store in its place.
        logger.warning("codegen cache: the index of %s is corrupt (%s); starting that store afresh",
                       self.directory, err)
        if self._cache is not None and not isinstance(self._cache, ReadOnlyView):
            with contextlib.suppress(*STORAGE_ERRORS):
                self._cache.close()
        self._cache = None
        # The reader reads the damaged database too. Dropped without its lock (a lookup holding
        # it may be what found the damage); the connection closes when the last user lets go.
        self._reader = None
        aside = self.directory.with_name(f".{self.directory.name}.corrupt-{os.getpid()}-{time.time_ns()}")
        try:
            os.rename(self.directory, aside)
        except OSError:
            return  # another process moved it first
        shutil.rmtree(aside, ignore_errors=True)

    def _run(self, func, *args, **kwargs):
        # Every SQLite call passes the fork gate. A store can also turn out damaged after it
        # opened: start afresh, then fail this call (the cache counts it as a miss or a skipped
        # store); the next call opens the new store.
        with sqlite_gate:
            try:
                return func(*args, **kwargs)
            except sqlite3.DatabaseError as err:
                if _is_corrupt(err) and self._cache is not None and not isinstance(self._cache, ReadOnlyView):
                    with self._lock:
                        self._start_afresh(err)
                raise
            except _lock_timeout() as err:
                raise TimeoutError(f"{self.directory} stayed locked past its timeout ({self.timeout} s)") from err

    def _writable_cache(self) -> diskcache.Cache:
        """The open store for a write; reopened (recreated) if its directory was removed."""
        cache = self._open()
        if isinstance(cache, ReadOnlyView):
            raise ReadOnlyStoreError(self.directory)
        if self._db_identity() != self._db_id:
            # Removed (or replaced) under this process: a write would go into an unlinked file
            # and be lost while counted as stored. Open (and so create) the store again.
            logger.info("codegen cache: %s was removed or replaced; opening it again", self.directory)
            with self._lock:
                with contextlib.suppress(*STORAGE_ERRORS):
                    cache.close()
                self._cache = None
            self._drop_reader()  # it reads the removed database: the next lookup connects to the new one
            cache = self._open()
            if isinstance(cache, ReadOnlyView):
                raise ReadOnlyStoreError(self.directory)
        return cache

    @property
    def read_only(self) -> bool:
        """True when the store's directory cannot be written: reads work, writes raise."""
        return isinstance(self._open(), ReadOnlyView)

    def read(self, key: str) -> Row | None:
        """The row stored under `key`: its bytes and, for a value file, the file's path."""
        row = self._read_key_file(key)
        if row is not None:
            return row
        found = self._read_row(key)
        if found is self._UNREADABLE or isinstance(self._cache, ReadOnlyView):
            cache = self._open()
            blob = self._run(cache.get, key)
            return None if blob is None else Row(blob, None)
        if found is None:
            return None
        mode, filename, value, size = found
        if mode == _MODE_RAW:
            if not isinstance(value, bytes):
                raise UnsafeEntryError(f"row of mode {mode} holds a {type(value).__name__}")
            return Row(value, None)
        if mode != _MODE_BINARY:
            raise UnsafeEntryError(f"refusing to read a cache row of mode {mode} (only bytes are stored)")
        try:
            blob, path = read_value_file(str(self.directory), filename, int(size))
        except FileNotFoundError:
            return None  # evicted by another process between the row and the file
        return Row(blob, path)

    def contains(self, key: str) -> bool:
        """Whether `key` has a row whose value is there, without reading the value."""
        named = self._named_by_key_file(key)
        if named is not None and file_size(os.path.join(str(self.directory), named[0])) == named[1]:
            return True
        found = self._read_row(key)
        if found is None or found is self._UNREADABLE or found is self._DAMAGED:
            return False
        mode, filename, _value, size = found
        return mode != _MODE_BINARY or file_size(os.path.join(str(self.directory), filename)) == int(size)

    def _read_key_file(self, key: str) -> Row | None:
        """The value file `key`'s key file names, read without SQLite; None where there is none to read."""
        named = self._named_by_key_file(key)
        if named is None:
            return None
        try:
            blob, path = read_value_file(str(self.directory), named[0], named[1])
        except (OSError, ArtifactError, UnsafeEntryError):
            return None  # evicted or replaced meanwhile, or not a file of the store's: the row decides
        return Row(blob, path)

    def _named_by_key_file(self, key: str) -> tuple[str, int] | None:
        """(value file name, size) that `key`'s key file holds, when it is one this store wrote."""
        keys = self._keys_dir
        if keys is None:
            keys = self._real_keys_dir()
        if not keys or not _KEY_FILE_NAME.match(key):
            return None
        try:
            fd = os.open(os.path.join(keys, key), READ_FLAGS)
        except OSError:
            return None  # no key file (nor a link: O_NOFOLLOW)
        try:
            text = read_whole(fd, _KEY_FILE_MAX)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            filename, size, end = (text or b"").decode("ascii").split("\n")
        except (UnicodeDecodeError, ValueError):
            return None
        if end or not size.isdigit() or not VALUE_FILE.match(filename):
            return None
        return filename, int(size)

    def _real_keys_dir(self) -> str | None:
        """`<store>/keys` where it is a real directory below the cache directory, else None (rows only).

        Kept once found (a link in its place: never looked at again in this process); a missing
        one is looked for again at the next lookup.
        """
        keys = self.directory / KEYS_DIR
        try:
            if not real_dir(keys, self.root):
                return None
        except OSError:
            self._keys_dir = ""  # a link or a file in its place: refused (warned once)
            return None
        self._keys_dir = str(keys)
        return self._keys_dir

    def _write_key_file(self, key: str) -> None:
        """Name the value file of `key`'s row in its key file (after the row: a reader finds the row's file).

        The row is stored already: a key file that cannot be written (a full disk, a link planted at
        keys/) costs later lookups the row's read, and fails nothing.
        """
        if not _KEY_FILE_NAME.match(key):
            return
        try:
            self._write_key_file_of(key)
        except (OSError, sqlite3.Error) as err:
            logger.debug("codegen cache: no key file for %s in %s (%s)", key[:16], self.directory, err)

    def _write_key_file_of(self, key: str) -> None:
        found = self._plain_row(key)
        if not isinstance(found, tuple) or len(found) != 4 or found[0] != _MODE_BINARY:
            return
        _mode, filename, _value, size = found
        keys = self.directory / KEYS_DIR
        ensure_dir(keys, self.root, make_root=False)
        fd, temp = tempfile.mkstemp(prefix=SCRATCH_PREFIX, dir=keys)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(f"{filename}\n{int(size)}\n".encode("ascii"))
            share_file_mode(temp)
            freeze_file_mode(temp)  # replaced by a rename, never rewritten in place
            os.replace(temp, keys / key)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    def _drop_key_files(self, keys: Iterable[str] | None = None) -> None:
        """Remove the key files of `keys`; None: those whose value file is gone (evicted, expired, replaced)."""
        directory = self.directory / KEYS_DIR
        try:
            if not real_dir(directory, self.root):
                return
            names = list(keys) if keys is not None else os.listdir(directory)
        except OSError:
            return
        if keys is None:
            sweep_leftovers(str(directory))  # a killed writer's unfinished key file
        for name in names:
            if not _KEY_FILE_NAME.match(name):
                continue
            if keys is None:
                named = self._named_by_key_file(name)
                if named is not None and file_size(os.path.join(self.directory, named[0])) == named[1]:
                    continue  # leads to its value file still
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))

    def get(self, key: str) -> bytes | None:
        """The bytes stored under `key`, or None."""
        row = self.read(key)
        return None if row is None else row.blob

    def put(self, key: str, blob: bytes, *, expire: float | None = None, tag: str | None = None,
            over: Callable[[bytes | None], bool] | None = None) -> bool:
        """Store `blob` under `key` (atomic for readers), then evict to the size limit.

        over: store only where over(the bytes stored under `key` now, None where none) is true,
        read and stored in one transaction of the store: no other process's put, delete or clear
        comes between the two (an entry replaced by its better form is the one that was read).
        """
        cache = self._writable_cache()
        if over is None:
            stored = bool(self._run(cache.set, key, blob, expire=expire, tag=tag, retry=False))
        else:
            stored = bool(self._run(_set_over, cache, key, blob, over, expire, tag))
        if stored and expire is None:
            self._write_key_file(key)
        if self._footprint_bound(cache) > self.size_limit:
            self.evict(keep=key)
        return stored

    def _footprint_bound(self, cache: diskcache.Cache) -> int:
        """At least the store's footprint, from what diskcache keeps as it goes (its volume and count).

        The footprint itself is a scan of the rows: it is counted (by evict) only where this bound
        passes the limit, and then kept, so that the next puts add only what grew since.
        """
        volume, count = int(self._run(cache.volume)), len(cache)
        measured = self._measured
        if measured is None:
            return volume + count * (BLOCK + ENTRY_OVERHEAD)  # a value file's last block, at most, and the rest
        at_volume, at_count, footprint = measured
        return footprint + max(0, volume - at_volume) + max(0, count - at_count) * (BLOCK + ENTRY_OVERHEAD)

    def footprint(self) -> int:
        """Bytes the store takes on disk as its size limit counts them: as `du` counts them, within a block
        per entry, but for SQLite's write-ahead log (transient, up to 4 MiB while the store is open)."""
        reader = self._connection()
        if reader is None or reader is self._UNREADABLE:
            return self.volume() if reader is not None else 0
        with self._reader_lock:
            rows, pages, page_size = self._run(lambda: (
                reader.execute(_FOOTPRINT).fetchone()[0], reader.execute("PRAGMA page_count").fetchone()[0],
                reader.execute("PRAGMA page_size").fetchone()[0]))
        footprint = int(rows) + int(pages) * int(page_size)
        cache = self._cache
        if cache is not None and not isinstance(cache, ReadOnlyView):
            self._measured = (int(self._run(cache.volume)), len(cache), footprint)
        return footprint

    def by_use(self) -> list[tuple[str, int, str | None, float]]:
        """(key, size, tag, time of last use) of every row, the least recently used first."""
        reader = self._connection()
        if reader is None or reader is self._UNREADABLE:
            return []
        with self._reader_lock:
            rows = self._run(lambda: reader.execute(_BY_USE).fetchall())
        return [(str(k), int(n), t, float(used or 0.0)) for k, n, t, used in rows]

    def mark_used(self, keys: Iterable[str], when: float) -> int:
        """Record that `keys` were used at `when` (a batch of hits: one transaction); how many rows changed.

        Never raises for the storage: a mark that cannot be written (a read-only or locked store,
        none yet) leaves its entry as old as its last recorded use.
        """
        try:
            reader = self._connection()
            if reader is None or reader is self._UNREADABLE:
                return 0
            with self._reader_lock:
                return self._run(self._mark_all, reader, [(when, key, when) for key in keys])
        except (*STORAGE_ERRORS, TimeoutError) as err:
            logger.debug("codegen cache: use marks not written to %s (%s)", self.directory, err)
            return 0

    @staticmethod
    def _mark_all(reader: sqlite3.Connection, rows: list[tuple[float, str, float]]) -> int:
        # One transaction for the batch, committed without waiting for the disk (synchronous=OFF,
        # on this connection, whose only writes are marks): a crash of the machine may lose the
        # batch's marks, never a row; a process that only hit pays no fsync at its exit.
        reader.execute("PRAGMA synchronous=OFF")
        reader.execute("BEGIN IMMEDIATE")
        try:
            cursor = reader.executemany(_MARK, rows)
            reader.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                reader.execute("ROLLBACK")
            raise
        return max(0, int(cursor.rowcount))

    def evict(self, *, keep: str | None = None, limit: int | None = None) -> int:
        """Remove the least recently used entries where the store is over its size limit (`limit`: another),
        down to LOW_WATER of it; how many went. `keep` stays (the entry a put just stored)."""
        evicted = evict_least_used(self, limit=self.size_limit if limit is None else limit, keep=keep,
                                   along=self.along)
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)
        return evicted

    def add(self, key: str, blob: bytes, *, expire: float | None = None) -> bool:
        """Store `blob` only if `key` is absent; True when this call stored it."""
        stored = bool(self._run(self._writable_cache().add, key, blob, expire=expire, retry=False))
        if stored and expire is None:
            self._write_key_file(key)
        return stored

    def delete(self, key: str) -> bool:
        """Remove `key`; True when it was there."""
        cache = self._open()
        if isinstance(cache, ReadOnlyView):
            raise ReadOnlyStoreError(self.directory)
        deleted = bool(self._run(cache.delete, key, retry=False))
        self._drop_key_files((key,))
        return deleted

    def keys(self) -> Iterator[str]:
        """Every key in the store."""
        return iter(self._run(lambda: list(self._open())))

    def __len__(self) -> int:
        return int(self._run(lambda: len(self._open())))

    def volume(self) -> int:
        """Bytes on disk (database plus value files)."""
        return int(self._run(lambda: self._open().volume()))

    def expire(self) -> int:
        """Drop expired entries; how many went."""
        expired = int(self._run(self._writable_cache().expire, retry=False))
        self._drop_key_files()  # and key files left by killed writers' evictions
        return expired

    def clear(self) -> int:
        """Remove every entry; how many went."""
        cleared = int(self._run(self._writable_cache().clear, retry=False))
        self._drop_key_files()
        return cleared

    def cull(self) -> int:
        """Evict the least recently used entries where the store is over its size limit (evict)."""
        return self.evict()

    def close(self) -> None:
        """Close the database connections of this process."""
        with self._lock:
            if self._cache is not None:
                with contextlib.suppress(*STORAGE_ERRORS):
                    self._cache.close()
            self._cache = None
        self._drop_reader()

    def _drop_reader(self) -> None:
        with self._reader_lock:
            if self._reader is not None:
                with contextlib.suppress(*STORAGE_ERRORS):
                    self._reader.close()
            self._reader = None

