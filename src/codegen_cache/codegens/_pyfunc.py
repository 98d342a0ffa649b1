"""The Python callable behind a tvm-ffi Function (tvm-ffi has no API that hands it back).

Why it is still read: to tell TVM's and tilelang's own callbacks from users' (_owner.py) where
public API cannot. tvm-ffi reports no owner or source of a Function (its metadata is empty for
every Python-registered one), and a registration by call, `register_global_func(name, f)` (how
tilelang registers its callbacks), leaves the Function reachable only through the registry.
Public API comes first (_owner.owner_name): TVM 0.27's own callbacks are found at their homes.

A Function made from a Python callable keeps it (or a closure whose first word is it) in a
fixed word of the C object. The word, and the words every such Function shares (type index,
deleters, call trampolines), are learnt at first use from two probe functions; a Function is
read only after those shared words match, so a C/C++ function is never followed into. The
fallback: where the layout is not recognized, no callable is returned, and a callback not
found through public API counts as a user's (uncacheable, never misidentified). Tests fail when
the layout changes (tests/test_key_callbacks.py).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from typing import Any

from .. import _compat

__all__ = ["python_callable"]

_WORDS = 8


def _words(handle: int) -> tuple[int, ...]:
    # Only the probe functions are read this way (Python-backed, so at least _WORDS long): one
    # copy of their words costs what one from_address does.
    return struct.unpack(f"<{_WORDS}Q", ctypes.string_at(handle, 8 * _WORDS))


@functools.lru_cache(maxsize=1)
def _layout() -> tuple[int, bool, tuple[tuple[int, int], ...]] | None:
    """Where a Function made from a Python callable keeps it, learnt from two probe functions.

    Returns (word offset, whether that word points at a closure whose first word is the
    callable, the (offset, value) words every such Function shares), or None when the layout
    is not recognized (then every registered callback is uncacheable, never misidentified).
    """

    def probe_a():
        return "a"

    def probe_b():
        return "b"

    # tvm_ffi.convert_func wraps a callable without convert's isinstance walk over TVM's types
    # (docs/maintaining.md, "What each one buys"); tvm-ffi before 0.1.14 has only convert.
    wrap = getattr(_compat.tvm_ffi, "convert_func", None) or _compat.tvm_ffi.convert
    fa, fb = wrap(probe_a), wrap(probe_b)
    wa, wb = _words(fa.__chandle__()), _words(fb.__chandle__())
    for offset in range(1, _WORDS):
        a, b = wa[offset], wb[offset]
        if a == id(probe_a) and b == id(probe_b):
            direct = True
        elif a != b and a > 1 << 16 and b > 1 << 16 and _read(a) == id(probe_a) and _read(b) == id(probe_b):
            direct = False
        else:
            continue
        shared = tuple((i, wa[i]) for i in range(1, _WORDS) if i != offset and wa[i] == wb[i])
        return offset, direct, shared
    return None


def _read(address: int) -> int:
    return ctypes.c_uint64.from_address(address).value


def python_callable(func: Any) -> Any | None:
    """The Python object a tvm-ffi Function calls, or None when it is not a Python callable."""
    layout = _layout()
    if layout is None:
        return None
    offset, direct, shared = layout
    handle = func.__chandle__()
    # Compare the words every Python-backed Function shares (type index, deleters, call
    # trampolines) in address order, one at a time, before following any pointer: a C++
    # function differs in its deleter and call words, which lie inside every Function, so
    # nothing past a smaller object is read.
    for i, value in shared:
        if _read(handle + 8 * i) != value:
            return None
    word = _read(handle + 8 * offset)
    pointer = word if direct else _read(word)
    return ctypes.cast(ctypes.c_void_p(pointer), ctypes.py_object).value
