"""Counters per process, added into one SQLite table in the cache directory.

Each process counts in memory and adds its counts to `<dir>/stats.sqlite` (an UPSERT per
counter in one transaction) every few seconds, at `stats()` and at exit, so that the numbers
of every process using the directory add up without a write on every hit.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import weakref
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .._storage._disk import share_file_mode, storage_fault

__all__ = ["COUNTERS", "CacheStats", "StatsRecorder"]

logger = logging.getLogger(__name__)

COUNTERS = (
    "hits_memory",
    "hits_disk",
    "hits_remote",
    "misses",
    "builds",
    "stores",
    "stores_skipped",
    "evictions",
    "evictions_memory",
    "collisions",
    "corrupt",
    "failures_stored",
    "failures_served",
    "mutations",
    "lease_waits",
    "lease_takeovers",
    "remote_stores",
    "remote_rejected",
    "remote_misses",
    "remote_skipped",
    "remote_offline",
    "build_seconds",
    "saved_seconds",
    "uncacheable",
)


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the counters; `errors` maps an error kind to its count."""

    hits_memory: int = 0
    hits_disk: int = 0
    hits_remote: int = 0
    misses: int = 0
    builds: int = 0
    stores: int = 0
    stores_skipped: int = 0
    evictions: int = 0
    evictions_memory: int = 0
    collisions: int = 0
    corrupt: int = 0
    failures_stored: int = 0
    failures_served: int = 0
    mutations: int = 0
    lease_waits: int = 0
    lease_takeovers: int = 0
    remote_stores: int = 0
    remote_rejected: int = 0
    remote_misses: int = 0
    remote_skipped: int = 0
    remote_offline: int = 0
    build_seconds: float = 0.0
    saved_seconds: float = 0.0
    uncacheable: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def hits(self) -> int:
        """Hits of every tier."""
        return self.hits_memory + self.hits_disk + self.hits_remote

    def as_dict(self) -> dict[str, object]:
        """Every counter, plus hits, as a JSON-ready dict."""
        out: dict[str, object] = {name: getattr(self, name) for name in COUNTERS}
        out["hits"] = self.hits
        out["errors"] = dict(self.errors)
        return out

    @classmethod
    def from_counts(cls, counts: dict[str, float]) -> CacheStats:
        """Build from a flat name -> value dict ('error:<kind>' names go to errors)."""
        values: dict[str, object] = {}
        errors: dict[str, int] = {}
        for name, value in counts.items():
            if name.startswith("error:"):
                errors[name[6:]] = int(value)
            elif name in COUNTERS:
                values[name] = float(value) if name.endswith("seconds") else int(value)
        return cls(**values, errors=errors)  # type: ignore[arg-type]


class StatsRecorder:
    """In-memory counters of this process, flushed into `<dir>/stats.sqlite`."""

    FLUSH_INTERVAL = 2.0

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._pending: Counter[str] = Counter()
        self._local: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._failed = False
        self._flusher: threading.Thread | None = None

    def add(self, name: str, amount: float = 1, *, saved_seconds: float = 0.0) -> None:
        """Count `amount` more of `name` (and, for a hit, the build time it saved)."""
        # Locked: flush() swaps _pending on another thread, and a count added to the old dict
        # after the swap would be lost.
        with self._lock:
            self._pending[name] += amount
            self._local[name] += amount
            if saved_seconds:
                self._pending["saved_seconds"] += saved_seconds
                self._local["saved_seconds"] += saved_seconds
            if self._flusher is None and self.path is not None:
                # Flushing on a thread of its own keeps SQLite writes off the hit path.
                self._flusher = threading.Thread(target=_flush_loop, args=(weakref.ref(self),),
                                                 name="codegen-cache-stats", daemon=True)
                self._flusher.start()

    def local(self) -> CacheStats:
        """Counts of this process only, since it opened the cache."""
        with self._lock:
            return CacheStats.from_counts(dict(self._local))

    def _connect(self) -> sqlite3.Connection:
        assert self.path is not None
        conn = sqlite3.connect(str(self.path), timeout=2.0, isolation_level=None)
        share_file_mode(self.path)  # SQLite creates it 0644: a team cache needs it group-writable
        conn.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value REAL NOT NULL)")
        return conn

    def flush(self) -> None:
        """Add the pending counts to the shared table (kept pending if it cannot be written)."""
        with self._lock:
            pending, self._pending = self._pending, Counter()
            self._last_flush = time.monotonic()
        if not pending or self.path is None:
            return
        try:
            conn = self._connect()
            try:
                with conn:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.executemany(
                        "INSERT INTO counters(name, value) VALUES (?, ?) "
                        "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                        list(pending.items()),
                    )
            finally:
                conn.close()
        except (sqlite3.Error, OSError) as err:
            with self._lock:
                self._pending.update(pending)
            if not self._failed:
                # A full disk or a read-only directory is the cache's one warning, not ours too.
                log = logger.debug if storage_fault(err, self.path.parent) else logger.warning
                log("codegen cache: cannot write stats to %s (%s); counting in memory", self.path, err)
                self._failed = True

    def shared(self) -> CacheStats:
        """Counts of every process that used this directory (this one's flushed first)."""
        self.flush()
        if self.path is None or not self.path.exists():
            return self.local()
        try:
            conn = self._connect()
            try:
                rows = dict(conn.execute("SELECT name, value FROM counters").fetchall())
            finally:
                conn.close()
        except (sqlite3.Error, OSError):
            return self.local()
        with self._lock:
            for name, value in self._pending.items():
                rows[name] = rows.get(name, 0) + value
        return CacheStats.from_counts(rows)

    def reset(self) -> None:
        """Zero the shared table and this process's counts."""
        with self._lock:
            self._pending.clear()
            self._local.clear()
        if self.path is None or not self.path.exists():
            return
        try:
            conn = self._connect()
            try:
                conn.execute("DELETE FROM counters")
            finally:
                conn.close()
        except (sqlite3.Error, OSError) as err:
            logger.warning("codegen cache: cannot reset stats in %s: %s", self.path, err)


def _flush_loop(ref: weakref.ReferenceType[StatsRecorder]) -> None:
    """Add a recorder's pending counts to the shared table every FLUSH_INTERVAL seconds."""
    while True:
        time.sleep(StatsRecorder.FLUSH_INTERVAL)
        recorder = ref()
        if recorder is None:
            return
        recorder.flush()
        del recorder
