"""Fetching and keeping by key digest, for codegen_cache.build's index (which knows digests, not IRModules)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._artifacts import keep_answering
from .._storage._layout import ENTRY_STORES
from .._storage._memory import MemoryEntry
from ._state import CacheState
from ._tiers import Entry, Hit, Probe

if TYPE_CHECKING:
    from .._compat import Module

__all__ = ["ByDigest"]


class ByDigest(CacheState):
    """CodegenCache's fetch, fetch_kept and keep (a mixin: the attributes are CodegenCache's, see _state.py)."""

    def fetch(self, digest: str, mode: str, *, ir: Any = None, fresh: bool = False, count: bool = True,
              codegen: str | None = None) -> tuple[Module, dict[str, Any]] | None:
        """The module and metadata stored under a key digest, or None; never calls a codegen.

        For codegen_cache.build, whose index knows the digests of a build's entries but not
        their lowered IRModules. Memory first (unless fresh): with `ir`, a hit must hold an
        equal IRModule, as in lower(); without it the digest is trusted. Then that mode's store
        ("compiled" or "source") and the remote tier. fresh=True returns a newly decoded module
        the caller may change (import_module). With verify=True nothing is served by digest
        alone (`ir` is required). A hit is counted (for `codegen`, when given), unless count=False.
        """
        if mode not in ENTRY_STORES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {ENTRY_STORES}")
        return self._fetch(digest, mode, ir=ir, fresh=fresh, count=count, codegen=codegen)

    def fetch_kept(self, digest: str, *, ir: Any = None, count: bool = True,
                   codegen: str | None = None) -> tuple[Module, dict[str, Any]] | None:
        """What keep() put under `digest`, from this process's memory tier only, or None; as fetch() does."""
        return self._fetch(digest, None, ir=ir, fresh=False, count=count, codegen=codegen)

    def _fetch(self, digest: str, mode: str | None, *, ir: Any, fresh: bool, count: bool,
               codegen: str | None) -> tuple[Module, dict[str, Any]] | None:
        # mode None: fetch_kept, the memory tier only (the chain stops after it).
        if self.settings.disable or self.settings.recache or (self.settings.verify and ir is None) or not self.trusted:
            return None
        hit = None
        if ir is None and not fresh:
            found = self._memory.get(digest)  # the digest is trusted: no IRModule to compare
            if found is not None:
                hit = Hit("memory", Entry(digest, mode or "compiled", found.module, found.ir, found.meta))
        if hit is None and (ir is not None or mode is not None):
            probe = Probe(digest, mode or "compiled", ir, False)
            # A memory entry needs its IRModule (exact hits), and a fresh module is the
            # caller's alone: neither goes into memory.
            hit = self._chain.lookup(probe, start=1 if fresh or ir is None else 0, stop=1 if mode is None else None,
                                     fill=ir is not None and not fresh)
        if not isinstance(hit, Hit):
            return None
        if count:
            saved = float(hit.entry.meta.get("build_seconds", 0.0))
            if codegen is not None:
                self._stats.add_for(codegen, mode or "compiled", f"hits_{hit.tier}")
                self._stats.add_for(codegen, mode or "compiled", "saved_seconds", saved)
            else:
                self._stats.add(f"hits_{hit.tier}")
                self._stats.add("saved_seconds", saved)
        keep_answering(hit.entry.module)
        return hit.entry.module, hit.entry.meta

    def keep(self, digest: str, module: Module, ir: Any, meta: dict[str, Any], nbytes: int = 1 << 16) -> None:
        """Keep `module` in the memory tier under `digest`, with the object that makes hits exact.

        For results that are not one codegen's (codegen_cache.build keeps a whole built module
        under its build key): this process only, dropped by clear() and by LRU eviction.
        """
        self._memory.put(digest, MemoryEntry(module, ir, nbytes, meta))
