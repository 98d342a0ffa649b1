"""Counters that survive the process that counted them, with nothing to flush.

Each process counts into a small file of its own, `<dir>/stats/<host>-<pid>-<random>.cnt`
(made as `cgc-<name>.new` and renamed once its process holds its lock), mapped into memory: a
count is a store into the page cache, so it survives os._exit, SIGTERM and SIGKILL, and no
thread or exit handler has to write it. The process holds an
flock on its file while it lives. Totals are the sum of `<dir>/stats.sqlite` and every file;
a file whose lock can be taken belongs to a process that is gone, and is folded into the
database (once: the file's name is recorded in the same transaction) and removed.

No file waits for a reader: a process folds its own file at exit (an atexit handler, after the
background writer's last jobs), and a process that opens its file has the files of gone
processes folded (by `background`, the cache's writer thread: never on the caller's path).
So `stats/` holds one file per live process, plus the files of processes that ended without
exit handlers (os._exit: fork pool workers; a signal) until the next process counts there.

File layout: b"CGCN" | u32 version | u32 slots | slots x 64-byte records
(u8 used | u8 name length | 54 bytes name | f64 value).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import mmap
import os
import re
import socket
import sqlite3
import stat
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from .._artifacts import SCRATCH_PREFIX
from .._forksafe import on_fork_child, sqlite_gate
from ._faults import FILE_MODE, ensure_dir, real_dir, share_file_mode
from ._fsprobe import sweep_leftovers

__all__ = ["CounterTable"]

logger = logging.getLogger(__name__)

_MAGIC, _VERSION, _SLOTS, _RECORD, _HEADER = b"CGCN", 1, 512, 64, 16
_NAME_MAX = 54
_FILE_SIZE = _HEADER + _SLOTS * _RECORD
_HEAD = struct.Struct("<4sII")
_FILE_NAME = re.compile(r"^[\w.-]+-\d+-[0-9a-f]{8}\.cnt$")
_FOLDED_KEEP = 86400.0
_PROBE_FILES = 4  # past this many other files, the writer looks at them all
# Only its process writes a counter file, through a shared mapping: nobody else may write it (a
# truncation by another member of a team cache would kill that process with SIGBUS on its next
# count). Others read it and fold it (a read-only descriptor takes the flock); removing it
# needs only the directory's write permission.
_OWN_FILE_MODE = FILE_MODE & ~0o022


def _read_counts(data: bytes) -> dict[str, float]:
    if len(data) < _HEADER:
        return {}
    magic, version, slots = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC or version != _VERSION:
        return {}
    counts: dict[str, float] = {}
    for i in range(min(slots, (len(data) - _HEADER) // _RECORD)):
        at = _HEADER + i * _RECORD
        if data[at] != 1:
            continue
        name_len = min(data[at + 1], _NAME_MAX)
        try:
            name = data[at + 2 : at + 2 + name_len].decode()
        except UnicodeDecodeError:
            continue
        (value,) = struct.unpack_from("<d", data, at + 56)
        if value == value:  # not NaN
            counts[name] = counts.get(name, 0.0) + value
    return counts


# Tables that count into a file of their own now: each folds it at exit. Held here until then
# (a table dropped earlier would leave its file, still locked by its descriptor, unfolded).
_open_tables: set[CounterTable] = set()


def _fold_at_exit() -> None:
    for table in list(_open_tables):
        table.fold_own()


# Registered at import, before any table counts: atexit runs it after the handlers registered
# later, and the writer's last jobs run before every atexit handler (_cache/_writer.py).
atexit.register(_fold_at_exit)


class CounterTable:
    """Named counters of every process that used a cache directory."""

    def __init__(self, directory: Path, *, make_root: bool = True,
                 background: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.directory = Path(directory)
        self.make_root = make_root  # False: a helper process never makes a removed cache directory again
        self.background = background  # runs a job off the caller's path (the cache's writer)
        self.files_dir = self.directory / "stats"
        self.db_path = self.directory / "stats.sqlite"
        self._lock = threading.Lock()
        self._reset_process()
        on_fork_child(self._reset_process)

    def _reset_process(self) -> None:
        # In a child of fork: the parent's file and mapping stay the parent's; count anew.
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)  # close only: the flock is shared with the parent, which keeps it
        self._lock = threading.Lock()
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._values: memoryview | None = None
        self._slots: dict[str, int] = {}
        self._memory: Counter[str] = Counter()  # where no file can be made (read-only, full disk)
        self._removed: Counter[str] = Counter()  # counted into a file deleted with its directory
        self._folded: Counter[str] = Counter()  # counted into a file this process folded itself
        self._opened = False
        self._name: str | None = None

    # ---- this process's counts --------------------------------------------------------------

    def add(self, name: str, amount: float = 1.0) -> None:
        """Count `amount` more of `name`."""
        self.add_many(((name, amount),))

    def add_many(self, counts: Iterable[tuple[str, float]]) -> None:
        """Count each (name, amount) (one lock for all: a hit counts four)."""
        with self._lock:
            if not self._opened:
                self._open_own()
            for name, amount in counts:
                slot = self._slots.get(name)
                if slot is None:
                    slot = self._allocate(name)
                if slot < 0:
                    self._memory[name] += amount
                else:
                    self._values[9 + 8 * slot] += amount  # type: ignore[index]

    def _open_own(self) -> None:
        self._opened = True
        name = f"{socket.gethostname()[:32]}-{os.getpid()}-{os.urandom(4).hex()}.cnt"
        path = self.files_dir / name
        # Made under a name no scan reads, and renamed to its own once locked: a file another
        # process could lock is one whose process is gone, so a scan between the creation and the
        # lock would fold it, record its name as folded and remove it, and this process's counts
        # would go into a file nobody reads.
        # One left by a process killed in between is a scratch leftover (swept when an hour old).
        unlocked = self.files_dir / f"{SCRATCH_PREFIX}{name}.new"
        try:
            ensure_dir(self.files_dir, self.directory, make_root=self.make_root)
            fd = os.open(unlocked, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _OWN_FILE_MODE)
        except OSError as err:
            logger.debug("codegen cache: counting in memory (cannot create %s: %s)", path, err)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(unlocked, path)
            # Blocks reserved now: a store into a mapped page of a sparse file on a full disk
            # would kill the process with SIGBUS.
            try:
                os.posix_fallocate(fd, 0, _FILE_SIZE)
            except OSError as err:
                if err.errno not in (95,):  # EOPNOTSUPP: write the zeros instead
                    raise
                os.pwrite(fd, bytes(_FILE_SIZE), 0)
            os.pwrite(fd, _HEAD.pack(_MAGIC, _VERSION, _SLOTS), 0)
            self._map = mmap.mmap(fd, _FILE_SIZE)
            self._values = memoryview(self._map).cast("d")
        except OSError as err:
            logger.debug("codegen cache: counting in memory (cannot set up %s: %s)", path, err)
            os.close(fd)
            for leftover in (unlocked, path):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
            return
        self._fd, self._name = fd, name
        _open_tables.add(self)
        if self.background is not None and self._any_gone():
            self.background(self.fold_gone)

    def _allocate(self, name: str) -> int:
        if self._map is None or len(self._slots) >= _SLOTS:
            self._slots[name] = -1
            return -1
        slot = len(self._slots)
        encoded = name.encode()[:_NAME_MAX]
        at = _HEADER + slot * _RECORD
        self._map[at + 1 : at + 2 + len(encoded)] = bytes([len(encoded)]) + encoded
        self._map[at] = 1  # last: a reader never sees a half-written name as used
        self._slots[name] = slot
        return slot

    def local(self) -> dict[str, float]:
        """Counts of this process since it first counted."""
        counts = Counter(self._own())
        counts.update(self._removed)
        counts.update(self._folded)
        return dict(counts)

    def _own(self) -> dict[str, float]:
        """This process's counts in its file (and in memory): its part of the directory's totals."""
        with self._lock:
            counts = dict(self._memory)
            if self._map is not None:
                for name, value in _read_counts(bytes(self._map)).items():
                    counts[name] = counts.get(name, 0.0) + value
            return counts

    def check_linked(self) -> None:
        """Count into a new file from now on if ours was deleted (the cache directory was removed).

        Its counts went with the directory the user removed: they stay in this process's
        local() counts, not in the new directory's totals.
        """
        with self._lock:
            if self._fd < 0:
                return
            try:
                if os.fstat(self._fd).st_nlink > 0:
                    return
            except OSError:
                return
            if self._map is not None:
                self._removed.update(_read_counts(bytes(self._map)))
                self._values.release()  # type: ignore[union-attr]
                self._map.close()
            self._removed.update(self._memory)
            os.close(self._fd)  # our own lock: closing releases it
            self._fd, self._map, self._values, self._name = -1, None, None, None
            self._slots, self._memory, self._opened = {}, Counter(), False

    def fold_own(self) -> None:
        """Fold this process's file into the database and remove it (a later count opens a new one).

        Exactly once: the file stays locked until it is removed, so no other process folds it
        meanwhile, and its counts move to the database in the transaction that records its name.
        """
        with self._lock:
            if self._map is None or self._name is None:
                return
            try:
                if os.fstat(self._fd).st_nlink == 0:
                    return  # its directory was removed: check_linked's case
            except OSError:
                return
            counts = _read_counts(bytes(self._map))
            if not self._fold(self._name, os.path.join(self.files_dir, self._name), counts):
                return  # the database cannot be written: the file stays, for the next folder
            self._folded.update(counts)
            self._values.release()  # type: ignore[union-attr]
            self._map.close()
            os.close(self._fd)
            self._fd, self._map, self._values, self._name = -1, None, None, None
            self._slots, self._opened = {}, False
            _open_tables.discard(self)

    def _any_gone(self) -> bool:
        """Whether `stats/` holds a file of a gone process (looking at _PROBE_FILES at most).

        On the caller's path (its first count): a directory listing and a lock attempt per
        file, so that the writer thread, which a fresh process has not started yet, is started
        only when there is something to fold.
        """
        try:
            with os.scandir(self.files_dir) as entries:
                names = [e.name for e in entries if e.name != self._name and _FILE_NAME.match(e.name)]
        except OSError:
            return False
        for name in names[:_PROBE_FILES]:
            try:
                fd = os.open(os.path.join(self.files_dir, name),
                             os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True  # nobody holds it: its process is gone
            except OSError:
                continue
            finally:
                os.close(fd)
        return len(names) > _PROBE_FILES

    def fold_gone(self) -> None:
        """Fold the files of processes that are gone into the database, and remove them."""
        self._scan(fold=True)

    # ---- every process's counts -------------------------------------------------------------

    def totals(self) -> dict[str, float]:
        """Counts of every process that used the directory (the gone ones folded in first)."""
        self.check_linked()
        live = self._scan(fold=True)
        totals = dict(self._db_rows())
        for name, value in live.items():
            totals[name] = totals.get(name, 0.0) + value
        return totals

    def zeroed_at(self) -> float | None:
        """When the counters were last reset (None: never)."""
        return self._db_meta("zeroed_at")

    def reset(self) -> None:
        """Zero the totals: the database is set to minus what live processes have counted."""
        self.check_linked()
        live = self._scan(fold=True)

        def zero(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM counters")
            conn.executemany("INSERT INTO counters(name, value) VALUES (?, ?)",
                             [(name, -value) for name, value in live.items() if value])
            conn.execute("INSERT OR REPLACE INTO meta(name, value) VALUES ('zeroed_at', ?)", (time.time(),))

        self._transaction(zero)

    def _scan(self, *, fold: bool) -> Counter[str]:
        """Live processes' counts; with fold, the files of gone processes go into the database."""
        live: Counter[str] = Counter(self._own())
        try:
            if not real_dir(self.files_dir, self.directory):  # never folds (and removes) files a link leads to
                return live
            with os.scandir(self.files_dir) as entries:
                names = [e.name for e in entries if _FILE_NAME.match(e.name) and e.name != self._name]
        except OSError:
            return live
        if fold:
            sweep_leftovers(str(self.files_dir))
        for name in names:
            path = os.path.join(self.files_dir, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_size > _FILE_SIZE:
                    continue
                data = os.pread(fd, _FILE_SIZE, 0)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    live.update(_read_counts(data))  # its process is alive
                    continue
                if fold:
                    self._fold(name, path, _read_counts(os.pread(fd, _FILE_SIZE, 0)))
            finally:
                os.close(fd)
        return live

    def _fold(self, name: str, path: str, counts: dict[str, float]) -> bool:
        def add(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM folded WHERE id = ?", (name,)).fetchone() is not None:
                return  # folded before a crash kept the file: remove it, do not count it twice
            conn.executemany("INSERT INTO counters(name, value) VALUES (?, ?) "
                             "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                             [(n, v) for n, v in counts.items() if v])
            conn.execute("INSERT INTO folded(id, at) VALUES (?, ?)", (name, time.time()))
            conn.execute("DELETE FROM folded WHERE at < ?", (time.time() - _FOLDED_KEEP,))

        if not self._transaction(add, durable=False):
            return False
        with contextlib.suppress(OSError):
            os.unlink(path)
        return True

    # ---- the database ---------------------------------------------------------------------------

    def _transaction(self, body, *, durable: bool = True) -> bool:
        """Run body(conn) in one IMMEDIATE transaction; True when it committed.

        durable=False (a fold: at every process's exit, and in its writer) commits without
        waiting for the disk (synchronous=OFF): an fsync would cost each short process more
        than its hit, and what a crash of the machine itself may lose is a few counts.
        A crash of the process alone loses nothing either way.
        """
        with sqlite_gate:
            conn = self._connect()
            if conn is None:
                return False
            try:
                if not durable:
                    conn.execute("PRAGMA synchronous=OFF")
                with conn:
                    conn.execute("BEGIN IMMEDIATE")
                    body(conn)
                return True
            except sqlite3.Error as err:
                logger.debug("codegen cache: stats database %s: %s", self.db_path, err)
                return False
            finally:
                conn.close()

    def _connect(self) -> sqlite3.Connection | None:
        try:
            existed = os.path.lexists(self.db_path)
            if existed and not stat.S_ISREG(os.lstat(self.db_path).st_mode):
                logger.warning("codegen cache: %s is not a regular file (a symlink?); not using it", self.db_path)
                return None
            conn = sqlite3.connect(str(self.db_path), timeout=2.0, isolation_level=None)
            if not existed:
                share_file_mode(self.db_path)  # SQLite creates it 0644: a team cache needs group-write
            conn.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value REAL NOT NULL)")
            conn.execute("CREATE TABLE IF NOT EXISTS folded (id TEXT PRIMARY KEY, at REAL NOT NULL)")
            conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value)")
            return conn
        except (sqlite3.Error, OSError) as err:
            logger.debug("codegen cache: cannot open stats database %s: %s", self.db_path, err)
            return None

    def _db_rows(self) -> list[tuple[str, float]]:
        if not self.db_path.exists():
            return []
        with sqlite_gate:
            conn = self._connect()
            if conn is None:
                return []
            try:
                return [(str(n), float(v)) for n, v in conn.execute("SELECT name, value FROM counters")]
            except sqlite3.Error:
                return []
            finally:
                conn.close()

    def _db_meta(self, name: str) -> float | None:
        if not self.db_path.exists():
            return None
        with sqlite_gate:
            conn = self._connect()
            if conn is None:
                return None
            try:
                row = conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
            except sqlite3.Error:
                return None
            finally:
                conn.close()
        return float(row[0]) if row is not None and isinstance(row[0], (int, float)) else None
