"""Identities of Python callables: a digest of their code and of the values they read.

A function is digested through its code objects (bytecode, constants, names, argument counts
and flags, recursively through nested code), defaults, the values it closes over and the
globals it reads. Values: plain data by value; modules by name and version; Python functions
digested the same way; functions and classes of the standard library or TVM by name; anything
else has no trustworthy identity (UncacheableError). Every object a digest was computed from
is kept in a watch list, so a memoized identity can be re-checked by `is` (`unchanged`).
"""

from __future__ import annotations

import builtins
import os
import sys
import sysconfig
import types
from typing import Any

import xxhash

from .. import _compat
from .._compat import tvm
from .._errors import UncacheableError

__all__ = ["Digest", "tvm_name", "unchanged"]

_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_MISSING = object()
_CELL = object()
_TVM_DIR = os.path.dirname(os.path.abspath(tvm.__file__)) + os.sep
_STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
_MAX_NODES = 400


def unchanged(watch: tuple) -> bool:
    """True while every object an identity was computed from is still the same object."""
    for container, key, expected in watch:
        if key is _CELL:
            try:
                current = container.cell_contents
            except ValueError:
                current = _MISSING
        elif type(container) is dict:
            current = container.get(key, _MISSING)
        else:
            current = getattr(container, key, _MISSING)
        if current is not expected:
            return False
    return True


class Digest:
    """Walks a Python function and what it reads, into an xxh3-128 digest and a watch list."""

    def __init__(self, name: str, what: str | None = None) -> None:
        self.name = name
        self.what = what or f"callback {name!r}"
        self.hash = xxhash.xxh3_128()
        self.watch: list[tuple[Any, Any, Any]] = []
        self.seen: set[int] = set()
        self.nodes = 0

    def uncacheable(self, reason: str) -> UncacheableError:
        return UncacheableError(
            self.what, reason,
            f"declare what it is with codegen_cache.declare_callback_salt({self.name!r}, '<version>') "
            "after registering it, and change the salt whenever its behaviour changes",
        )

    def identity(self, target: Any) -> str:
        own = tvm_name(target)
        if own is not None:
            if not getattr(target, "__closure__", None):
                return f"tvm {_compat.tvm_version()}: {own}"
            # TVM's code around values it closes over (a wrapper of a user's function): the
            # name stands for the code, the values are digested.
            self.cells(target)
            return f"tvm {_compat.tvm_version()}: {own} {self.hash.hexdigest()}"
        if not isinstance(target, types.FunctionType):
            raise self.uncacheable(f"it is a {type(target).__name__}, not a plain Python function")
        self.function(target)
        return f"code:{self.hash.hexdigest()}"

    def cells(self, fn: types.FunctionType) -> None:
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                contents = cell.cell_contents
            except ValueError:  # not assigned yet
                contents = _MISSING
            self.watch.append((cell, _CELL, contents))
            self.put("cell", var)
            if contents is not _MISSING:
                self.value(contents, f"the variable {var!r} it closes over")

    def put(self, *items: Any) -> None:
        for item in items:
            data = item if isinstance(item, bytes) else str(item).encode()
            self.hash.update(len(data).to_bytes(8, "little") + data)

    def function(self, fn: types.FunctionType) -> None:
        if id(fn) in self.seen:
            self.put("seen", fn.__qualname__)
            return
        self.seen.add(id(fn))
        self.watch += [(fn, "__code__", fn.__code__), (fn, "__defaults__", fn.__defaults__),
                       (fn, "__kwdefaults__", fn.__kwdefaults__)]
        self.put("function")
        self.code(fn.__code__)
        self.value(fn.__defaults__, "its defaults")
        self.value(tuple(sorted((fn.__kwdefaults__ or {}).items())), "its keyword defaults")
        self.cells(fn)
        for name in sorted(_global_names(fn.__code__)):
            found = fn.__globals__.get(name, _MISSING)
            self.watch.append((fn.__globals__, name, found))
            if found is not _MISSING:
                self.put("global", name)
                self.value(found, f"the global {name!r}")
            elif hasattr(builtins, name):
                self.put("builtin", name)

    def code(self, co: types.CodeType) -> None:
        self.put("code", co.co_code, co.co_argcount, co.co_posonlyargcount, co.co_kwonlyargcount, co.co_flags,
                 co.co_names, co.co_varnames, co.co_freevars, co.co_cellvars)
        for const in co.co_consts:
            if isinstance(const, types.CodeType):
                self.code(const)
            else:
                self.value(const, "a constant")

    def value(self, obj: Any, where: str) -> None:
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise self.uncacheable(f"it reads more than {_MAX_NODES} objects")
        if isinstance(obj, _PLAIN) or obj is Ellipsis:
            self.put(type(obj).__name__, repr(obj))
        elif type(obj) is tuple:
            self.put("tuple", len(obj))
            for item in obj:
                self.value(item, where)
        elif type(obj) is frozenset:
            # Sorted by repr: a frozenset's order depends on PYTHONHASHSEED.
            self.put("frozenset", len(obj), *sorted(repr(item) for item in obj))
            for item in obj:
                if not isinstance(item, _PLAIN):
                    self.value(item, where)
        elif isinstance(obj, types.ModuleType):
            self.put("module", obj.__name__, getattr(obj, "__version__", ""))
        elif tvm_name(obj) is not None:
            self.put("tvm", tvm_name(obj))
            if isinstance(obj, types.FunctionType) and obj.__closure__ and id(obj) not in self.seen:
                self.seen.add(id(obj))
                self.cells(obj)
        elif _stdlib_name(obj) is not None:
            self.put("stdlib", _stdlib_name(obj))
        elif isinstance(obj, types.FunctionType):
            self.function(obj)
        else:
            raise self.uncacheable(f"{where} is a {type(obj).__name__}, which has no trustworthy identity")


def _global_names(co: types.CodeType) -> set[str]:
    names = set(co.co_names)
    for const in co.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def tvm_name(obj: Any) -> str | None:
    """module.qualname of a function or class defined in the installed tvm package, else None."""
    code = getattr(obj, "__code__", None)
    module = getattr(obj, "__module__", None)
    if isinstance(obj, types.FunctionType) and code is not None and code.co_filename.startswith(_TVM_DIR):
        return f"{module}.{obj.__qualname__}"
    if isinstance(obj, type) and isinstance(module, str) and module.split(".")[0] in ("tvm", "tvm_ffi"):
        return f"{module}.{obj.__qualname__}"
    return None


def _stdlib_name(obj: Any) -> str | None:
    """module.qualname of a function or class of builtins or the standard library, else None.

    Python functions count only when their file is in the standard library's directory (a
    user's `code.py` has a standard module's name, not its file).
    """
    module = getattr(obj, "__module__", None) or ""
    if module.split(".")[0] not in sys.stdlib_module_names:
        return None
    if isinstance(obj, types.FunctionType):
        if not obj.__code__.co_filename.startswith(_STDLIB_DIR):
            return None
    elif not isinstance(obj, (types.BuiltinFunctionType, type)):
        return None
    return f"{module}.{getattr(obj, '__qualname__', obj.__name__)}"
