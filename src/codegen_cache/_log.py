"""Warn once, then quietly: the package's one helper for warnings that repeat.

A full disk or a read-only directory fails every store; a user needs one warning that says
so, not one per kernel. Later occurrences go to DEBUG; `forget` re-arms a warning (space came
back, so the next fill-up is news again).
"""

from __future__ import annotations

import logging
import threading

from ._forksafe import on_fork_child

__all__ = ["WarnOnce", "warn_once"]


class WarnOnce:
    """Warnings keyed by a name: the first at WARNING, the rest at DEBUG."""

    def __init__(self) -> None:
        self._seen: set[object] = set()
        self._lock = threading.Lock()
        on_fork_child(self._renew_lock)

    def _renew_lock(self) -> None:
        self._lock = threading.Lock()  # a thread of the parent may have held it

    def __call__(self, logger: logging.Logger, key: object, msg: str, *args: object) -> bool:
        """Log `msg`; True when this was the first time for `key` (logged at WARNING)."""
        with self._lock:
            first = key not in self._seen
            self._seen.add(key)
        logger.log(logging.WARNING if first else logging.DEBUG, msg, *args)
        return first

    def forget(self, key: object) -> None:
        """Warn again the next time `key` comes up."""
        with self._lock:
            self._seen.discard(key)


# Process-wide: for warnings about the environment (a filesystem, a toolchain), not one cache.
warn_once = WarnOnce()
