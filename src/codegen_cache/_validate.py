"""Argument checks for the public entry points: a TypeError/ValueError naming the argument,
the value and what is accepted, raised before any work starts."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["check_bool", "check_path", "check_timeout"]


def check_bool(name: str, value: Any) -> bool:
    """`value` if it is True or False; TypeError otherwise (a truthy string is a bug, not a yes)."""
    if type(value) is not bool:
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_timeout(name: str, value: Any) -> float | None:
    """A number of seconds, 0 or more, or None (no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r} ({type(value).__name__})")
    if not value >= 0:  # also NaN
        raise ValueError(f"{name} must be 0 or more seconds (None: no limit), got {value!r}")
    return float(value)


def check_path(name: str, value: Any, *, optional: bool = False) -> str | None:
    """A filesystem path (str or os.PathLike) as a str; None only when optional."""
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        accepted = "a path (str or os.PathLike)" + (" or None" if optional else "")
        raise TypeError(f"{name} must be {accepted}, got {value!r} ({type(value).__name__})")
    return os.fspath(value)
