"""Which cache DeviceCodegen.lower uses: a contextvar, else the process default.

This module knows caches only by the one method the registry calls (`ActiveCache`); the
default cache is made by a factory the cache layer registers, so the registry and this module
import no cache.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from ._forksafe import renew_after_fork

__all__ = ["ActiveCache", "active_cache", "get_cache", "pin_default", "set_default_factory", "use_cache"]


@runtime_checkable
class ActiveCache(Protocol):
    """What DeviceCodegen.lower needs of a cache."""

    def lower(self, mod: Any, target: Any, *, compile_device: bool, codegen: Any = None) -> Any:
        """Lower `mod` through the cache."""


_UNSET = object()
_active: contextvars.ContextVar[object] = contextvars.ContextVar("codegen_cache_active", default=_UNSET)
_factory: Callable[[], ActiveCache | None] | None = None
_default: ActiveCache | None = None
_made = False
_lock = threading.Lock()
renew_after_fork(globals(), "_lock")
# The cache codegen_cache.enable(cache=...) made the process default, in place of the factory's.
_pinned: object = _UNSET


def set_default_factory(factory: Callable[[], ActiveCache | None]) -> None:
    """How to make the default cache (None from the factory: caching is disabled)."""
    global _factory
    _factory = factory


def _default_cache() -> ActiveCache | None:
    global _default, _made
    if not _made:
        with _lock:
            if not _made and _factory is not None:
                _default = _factory()
                _made = True
    return _default


def active_cache() -> ActiveCache | None:
    """The cache DeviceCodegen.lower consults now (None: caching is off)."""
    value = _active.get()
    if value is _UNSET:
        pinned = _pinned
        return _default_cache() if pinned is _UNSET else pinned  # type: ignore[return-value]
    return value  # type: ignore[return-value]


def pin_default(cache: ActiveCache | None, *, unpin: bool = False) -> None:
    """Make `cache` the default of every context without use_cache (unpin=True: the factory's again)."""
    global _pinned
    _pinned = _UNSET if unpin else cache


def get_cache() -> ActiveCache | None:
    """The active cache: the one set by use_cache, else the default (None when disabled)."""
    return active_cache()


@contextlib.contextmanager
def use_cache(cache: ActiveCache | None) -> Iterator[ActiveCache | None]:
    """Make `cache` active for DeviceCodegen.lower inside the block; None turns caching off."""
    # A str has a .lower method too: a directory path is the likely mistake, so name the fix.
    if cache is not None and (not isinstance(cache, ActiveCache) or isinstance(cache, (str, bytes))):
        hint = f" (for a directory: use_cache(CodegenCache({cache!r})))" if isinstance(cache, (str, bytes)) else ""
        raise TypeError(f"use_cache expects a CodegenCache or None, got {type(cache).__name__}{hint}")
    token = _active.set(cache)
    try:
        yield cache
    finally:
        _active.reset(token)
