"""Target coercion and the canonical target string used in cache keys."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Union

from . import _compat

if TYPE_CHECKING:
    from ._compat import Target

__all__ = ["TargetLike", "as_target", "canonical_target"]

TargetLike = Union["Target", Mapping[str, Any], str]


def as_target(target: TargetLike) -> Target:
    """Accept a Target, a target dict, or a kind/tag string; raise ValueError naming the value."""
    if isinstance(target, _compat.Target):
        return target
    if isinstance(target, (str, Mapping)):
        try:
            return _compat.Target(dict(target) if isinstance(target, Mapping) else target)
        except (ValueError, TypeError, RuntimeError) as err:
            raise ValueError(
                f"Invalid target {target!r}: expected a tvm.target.Target, a target dict such as "
                f"{{'kind': 'cuda', 'arch': 'sm_90'}}, or a kind/tag string such as 'llvm' ({err})"
            ) from None
    raise TypeError(
        f"Invalid target {target!r} of type {type(target).__name__}: expected a tvm.target.Target, "
        "a target dict, or a kind/tag string"
    )


def _jsonable(value: Any) -> Any:
    # Plain values first, then classes by their MRO: isinstance against an ABC (Mapping, and
    # tvm-ffi's object classes) walks every subclass of it the first time a type is not one.
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    mro = type(value).__mro__
    if _compat.Target in mro:
        return _jsonable(value.export())
    if dict in mro or Mapping in mro:
        return {str(k): _jsonable(v) for k, v in value.items()}
    if list in mro or tuple in mro or type(value).__name__ == "Array":
        return [_jsonable(v) for v in value]
    return str(value)


@lru_cache(maxsize=1024)
def canonical_target(target: Target) -> str:
    """Sorted-key JSON of target.export() with the host expanded; memoized per Target object.

    str(target) is not canonical (attribute order follows construction), so keys use this.
    """
    return json.dumps(_jsonable(target.export()), sort_keys=True, separators=(",", ":"))
