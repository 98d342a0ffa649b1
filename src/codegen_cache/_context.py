"""Which cache DeviceCodegen.lower uses: a contextvar, else the process default."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ._config import settings_from_env

if TYPE_CHECKING:
    from ._cache._cache import CodegenCache

__all__ = ["active_cache", "get_cache", "use_cache"]

_UNSET = object()
_active: contextvars.ContextVar[object] = contextvars.ContextVar("codegen_cache_active", default=_UNSET)
_default: CodegenCache | None = None
_default_disabled: bool | None = None
_default_lock = threading.Lock()


def _default_cache() -> CodegenCache | None:
    global _default, _default_disabled
    if _default_disabled is None:
        with _default_lock:
            if _default_disabled is None:
                from ._cache._cache import CodegenCache

                settings = settings_from_env()
                _default = None if settings.disable else CodegenCache(settings=settings)
                _default_disabled = settings.disable
    return _default


def active_cache() -> CodegenCache | None:
    """The cache DeviceCodegen.lower consults now (None: caching is off)."""
    value = _active.get()
    if value is _UNSET:
        return _default_cache()
    return value  # type: ignore[return-value]


def get_cache() -> CodegenCache | None:
    """The active cache: the one set by use_cache, else the default (None when disabled)."""
    return active_cache()


@contextlib.contextmanager
def use_cache(cache: CodegenCache | None) -> Iterator[CodegenCache | None]:
    """Make `cache` active for DeviceCodegen.lower inside the block; None turns caching off."""
    from ._cache._cache import CodegenCache

    if cache is not None and not isinstance(cache, CodegenCache):
        raise TypeError(f"use_cache expects a CodegenCache or None, got {type(cache).__name__}")
    token = _active.set(cache)
    try:
        yield cache
    finally:
        _active.reset(token)
