"""A CodegenCache's upkeep: flush, stats, clear, close, and its stores for tools."""

from __future__ import annotations

import time
from pathlib import Path

from .._storage._disk import ArtifactStore
from .._storage._layout import ENTRY_STORES, FRONTEND_DIR, STORE_NAMES
from .._storage._pending import PendingFiles
from .._storage._plain import PlainFiles
from .._validate import check_bool, check_timeout
from . import _upgrade
from ._state import CacheState
from ._stats import CacheStats
from ._writer import writer

__all__ = ["FLUSH_SECONDS", "Maintenance"]

# Bound of flush(): the background jobs are extras (every entry is staged on disk already).
FLUSH_SECONDS = 30.0


class Maintenance(CacheState):
    """CodegenCache's flush, stats, clear, store, staged and close (a mixin: the attributes are CodegenCache's, see _state.py)."""

    def flush(self, timeout: float | None = FLUSH_SECONDS, *, upgrades: bool = False) -> bool:
        """Wait (at most `timeout` s) until staged entries of this process are in their stores.

        upgrades=True also waits for llvm entries to become shared libraries (a helper process
        does that). Returns True when everything finished in time. Nothing is lost when it does
        not: staged entries are served, and promoted by whoever reads them.
        """
        timeout = check_timeout("timeout", timeout)
        check_bool("upgrades", upgrades)
        deadline = None if timeout is None else time.monotonic() + timeout
        done = writer.wait(timeout)
        if upgrades:
            remaining = 600.0 if deadline is None else max(0.0, deadline - time.monotonic())
            done = _upgrade.wait_idle(self.directory, remaining) and done
            if self._pusher is not None:
                self._push_pending()  # the libraries the upgrader made and could not push itself
        return done

    def stats(self, *, shared: bool = True) -> CacheStats:
        """Counters of every process using this directory (shared=False: this process only)."""
        check_bool("shared", shared)
        return self._stats.shared() if shared else self._stats.local()

    def reset_stats(self) -> None:
        """Zero the shared counters (entries stay)."""
        self._stats.reset()

    def clear(self, *, compiled: bool = True, source: bool = True, failures: bool = True,
              index: bool | None = None) -> int:
        """Remove entries (every store by default); how many went. index follows compiled/source."""
        for name, value in (("compiled", compiled), ("source", source), ("failures", failures)):
            check_bool(name, value)
        if index is not None:
            check_bool("index", index)
        self.flush()
        self._memory.clear()
        if index is None:
            index = compiled or source
        removed = 0
        for name, wanted in (("compiled", compiled), ("source", source), ("failures", failures), ("index", index)):
            if wanted:
                removed += self._guard("clear", self._stores[name].clear) or 0
                if name in self._staged:
                    removed += self._staged[name].clear()
                elif name == "index":
                    removed += self._staged_index.clear()
        if index:
            removed += PlainFiles(Path(self.directory) / FRONTEND_DIR).clear()
        return removed

    def store(self, name: str) -> ArtifactStore:
        """The ArtifactStore 'compiled', 'source', 'failures' or 'index' (for tools)."""
        try:
            return self._stores[name]
        except KeyError:
            raise ValueError(f"unknown store {name!r}; expected one of {', '.join(STORE_NAMES)}") from None

    def staged(self, name: str) -> PendingFiles:
        """Entries of store 'compiled', 'source' or 'index' written but not yet moved into it (for tools)."""
        if name == "index":
            return self._staged_index
        try:
            return self._staged[name]
        except KeyError:
            raise ValueError(f"unknown store {name!r}; expected one of {', '.join((*ENTRY_STORES, 'index'))}") \
                from None

    def close(self, timeout: float | None = FLUSH_SECONDS) -> bool:
        """Finish this process's background stores (at most `timeout` s) and close the stores.

        Returns flush()'s answer: False when background jobs were still running (their
        entries are staged on disk: nothing is lost).
        """
        check_timeout("timeout", timeout)
        done = self.flush(timeout)
        for store in self._stores.values():
            store.close()
        if self._remote is not None and hasattr(self._remote, "close"):
            self._remote.close()
        return done

