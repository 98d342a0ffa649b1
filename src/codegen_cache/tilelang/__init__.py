"""codegen_cache for tilelang users: `enable()` routes tilelang's compiles through the active cache.

    import codegen_cache.tilelang
    codegen_cache.tilelang.enable()      # the active cache: use_cache(...), else CODEGEN_CACHE_DIR, ...
    kernel = tilelang.compile(func, target={"kind": "cuda", "arch": "sm_80"})

What is cached at each level, and the limits, are in docs/tilelang.md.
"""

from __future__ import annotations

from .. import _compat

__all__ = ["disable", "enable", "is_enabled"]


def _require_tilelang() -> None:
    if _compat.DISTRIBUTION != "tilelang":
        raise ImportError("codegen_cache.tilelang.enable() needs tilelang: pip install 'tvm-codegen-cache[tilelang]' "
                          "in an environment with tilelang (and without apache-tvm)")


def enable(*, frontend: bool = True) -> None:
    """Route tilelang's compiles through the active cache (idempotent).

    Two levels: tilelang.compile itself (a function compiled before comes back without
    lowering; tilelang >= 0.1.14; frontend=False leaves it to tilelang), and tilelang's device
    codegen (every tilelang version with the registry, 0.1.12 on).
    """
    _require_tilelang()
    from . import _device, _frontend

    _device.install()
    if frontend:
        _frontend.install()
    _device.prepare()


def disable() -> None:
    """Undo enable(): tilelang compiles as it does without this package."""
    from . import _device, _frontend

    _frontend.uninstall()
    _device.uninstall()


def is_enabled() -> bool:
    """True between enable() and disable()."""
    from . import _device

    return bool(_device._saved)  # noqa: SLF001
