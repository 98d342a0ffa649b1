"""Marks of use: a hit records its key in memory, and the marks reach the stores' rows in batches.

Eviction removes the least recently *used* entries (`ArtifactStore.evict`), so a hit must say
that its entry was used; it must not write for that, or every hit would pay a SQLite write.
A hit adds the key to a set in this process's memory (`mark`). The marks are written as one
UPDATE of each store's `access_time` column, with the time of the batch, as the counters are
folded (`_counters.py`): by the cache's background writer, never the caller, once BATCH marks
wait, and by the process itself at exit (atexit, after the writer's last jobs) for the rest.

What that costs in precision: a use counts from when its batch is written, at most a process's
lifetime late; a process killed without exit handlers (os._exit, SIGKILL) loses the marks it had
not written, so its entries look as old as their last recorded use, never newer; a mark racing
a write of its batch may go to the next batch or be dropped. None of that can make eviction
remove an entry used more recently than one it keeps by more than that delay.
"""

from __future__ import annotations

import atexit
import logging
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .._forksafe import on_fork_child

if TYPE_CHECKING:
    from ._disk import ArtifactStore

__all__ = ["BATCH", "UseMarks"]

logger = logging.getLogger(__name__)

BATCH = 256  # marks waiting before the writer writes them

# Every UseMarks with marks to write; written at exit.
_waiting: weakref.WeakSet[UseMarks] = weakref.WeakSet()


def _write_at_exit() -> None:
    for marks in list(_waiting):
        marks.write()


atexit.register(_write_at_exit)


class UseMarks:
    """The keys this process's hits used, per store, until they are written to the stores' rows."""

    def __init__(self, stores: Mapping[str, ArtifactStore],
                 background: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.stores = stores
        self.background = background  # runs a job off the caller's path (the cache's writer)
        self._reset()
        on_fork_child(self._reset)

    def _reset(self) -> None:
        # In a child of fork: the parent's marks are the parent's to write.
        self._pending: dict[str, set[str]] = {}
        self._count = 0
        self._scheduled = False

    def mark(self, store: str, key: str) -> None:
        """`key` of `store` was used now (no I/O: kept until its batch is written)."""
        keys = self._pending.get(store)
        if keys is None:
            keys = self._pending[store] = set()
            _waiting.add(self)
        keys.add(key)
        self._count += 1
        if self._count >= BATCH and not self._scheduled and self.background is not None:
            self._scheduled = True
            self.background(self.write)

    def write(self) -> int:
        """Write the waiting marks to the stores' rows now; how many rows were marked."""
        pending, self._pending = self._pending, {}
        self._count, self._scheduled = 0, False
        _waiting.discard(self)
        now, marked = time.time(), 0
        for name, keys in pending.items():
            store = self.stores.get(name)
            if store is not None and keys:
                marked += store.mark_used(keys, now)
        return marked
