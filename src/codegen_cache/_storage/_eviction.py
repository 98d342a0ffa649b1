"""Least recently used eviction of a store, down to a low-water mark, groups together.

Hits mark what they use (`_usage.py`), so the rows' `access_time` orders the entries by their
last use (a new entry counts as used when it is stored). A store over its limit loses the entries
used longest ago until its footprint is under LOW_WATER of the limit: one that overshoots a
little loses a tenth of its limit once, not an entry at every later put, and never the whole
store for a small overshoot. An entry tagged GROUP_TAG (a compiled model) names the entries it
is made of; `along` removes them as it goes, so no part of it stays behind to be served alone,
nor does it stay without its parts. Only the store's public methods are used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["BLOCK", "ENTRY_OVERHEAD", "GROUP_TAG", "LOW_WATER", "Evictable", "evict_least_used", "on_disk"]

GROUP_TAG = "group"  # a row whose entry names others that go when it goes (`along`)
BLOCK = 4096  # what a file takes at least on disk (a value file, a key file, a directory)
# Besides its value file's blocks, an entry takes its key file and, nearly always, a directory of
# its own (diskcache spreads value files over 65,536 two-level directories).
ENTRY_OVERHEAD = 2 * BLOCK

# Eviction stops below this share of the limit (ccache cleans to 80-90% of its limit, JAX's
# LRU cache to its limit; a margin is what keeps a full store from evicting at every put).
LOW_WATER = 0.9


class Evictable(Protocol):
    """What eviction needs of a store (ArtifactStore has it)."""

    def footprint(self) -> int: ...

    def by_use(self) -> list[tuple[str, int, str | None, float]]: ...

    def get(self, key: str) -> bytes | None: ...

    def delete(self, key: str) -> bool: ...


def on_disk(size: int) -> int:
    """What an entry of `size` bytes takes on disk: its value file in whole blocks, its key file, its directory."""
    return -(-size // BLOCK) * BLOCK + ENTRY_OVERHEAD


def evict_least_used(store: Evictable, *, limit: int, keep: str | None = None,
                     along: Callable[[bytes], None] | None = None) -> int:
    """Remove `store`'s least recently used entries while it is over `limit`, down to LOW_WATER of it.

    `keep` is never removed (the entry a put has just stored); along(entry bytes) runs for each
    GROUP_TAG entry removed. Returns how many entries went.
    """
    footprint = store.footprint()
    if footprint <= limit:
        return 0
    goal, freed, victims = footprint - int(limit * LOW_WATER), 0, []
    for key, size, tag, _used in store.by_use():
        if freed >= goal:
            break
        if key != keep:
            victims.append((key, tag))
            freed += on_disk(size)
    evicted = 0
    for key, tag in victims:
        blob = store.get(key) if tag == GROUP_TAG and along is not None else None
        if store.delete(key):
            evicted += 1
            if blob is not None:
                along(blob)  # type: ignore[misc]
    return evicted
