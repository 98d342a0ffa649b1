"""A bounded LRU of loaded modules, by entry count and bytes (what `_cache/_tiers.MemoryTier` keeps)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .._forksafe import on_fork_child

if TYPE_CHECKING:
    from .._compat import IRModule, Module

__all__ = ["MemoryEntry", "ModuleLRU"]


class MemoryEntry(NamedTuple):
    """A loaded module, the IRModule it was built from (for exact hits) and its size."""

    module: Module
    ir: IRModule
    nbytes: int
    meta: dict[str, Any]


class ModuleLRU:
    """LRU of MemoryEntry by key; evicts past `max_entries` or `max_bytes`."""

    def __init__(self, *, max_entries: int, max_bytes: int, on_evict: Callable[[], None] | None = None) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.on_evict = on_evict
        self._entries: OrderedDict[str, MemoryEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0
        on_fork_child(self._after_fork)

    def _after_fork(self) -> None:
        # A thread of the parent may have held the lock at the fork; the entries stay (a pool
        # worker serves what its parent built), their byte count is recomputed.
        self._lock = threading.Lock()
        self._bytes = sum(e.nbytes for e in self._entries.values())

    def get(self, key: str) -> MemoryEntry | None:
        """The entry under `key`, marked most recently used."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: str, entry: MemoryEntry) -> None:
        """Insert `entry`, evicting the least recently used beyond the limits."""
        if self.max_entries == 0 or entry.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = entry
            self._bytes += entry.nbytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict()

    def discard(self, key: str) -> None:
        """Forget `key`."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes held (artifact sizes of the entries)."""
        return self._bytes
