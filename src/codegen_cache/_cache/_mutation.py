"""Did a codegen change the IRModule it was given? Told by object identity, without a second hash.

A codegen must not change its input; one that does gets its result returned but not cached
(the key was computed from the module before the change).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from .._compat import IRModule

__all__ = ["changed", "parts_of"]


def parts_of(mod: IRModule) -> tuple:
    """What `mod` is made of, by object: its attributes, global infos and (name, function) pairs.

    While this tuple holds them, TVM's copy-on-write keeps each object as it is: a codegen that
    changes the module must put a new object in it (update_func, mod[name] = ...), which
    `changed` sees without hashing the module a second time (as long as the key's hash).
    """
    functions = sorted(((gv.name_hint, func) for gv, func in mod.functions.items()), key=lambda p: p[0])
    return (mod.attrs, mod.global_infos, tuple(functions))


def changed(before: tuple, after: tuple) -> str:
    """What differs between two `parts_of` of one module ('' when nothing did)."""
    if not _same(before[0], after[0]):
        return "its attributes were replaced"
    if not _same(before[1], after[1]):
        return "its global infos were replaced"
    names = [name for name, _ in before[2]]
    if names != [name for name, _ in after[2]]:
        return f"functions {names} became {[name for name, _ in after[2]]}"
    for (name, old), (_, new) in zip(before[2], after[2]):
        if not old.same_as(new):
            return f"function {name!r} was replaced"
    return ""


def _same(a: Any, b: Any) -> bool:
    return a is b or (a is not None and b is not None and a.same_as(b))
