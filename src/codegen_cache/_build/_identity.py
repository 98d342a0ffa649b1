"""The identity of a Python object registered into TVM: whose it is, and what would change it.

`identity(obj)` answers, for a function, a class, a partial, a bound method or a tvm-ffi
Function backed by one:
- None: TVM's own (code defined in the installed tvm or tvm_ffi package, holding nothing of a
  user's), keyed by TVM's version, a static salt of every key; or this package's own (the
  switch's routers), keyed by the package version, a part of the model key;
- a digest: a salt its author declared (`declare_salt`), else a digest of its code — the code
  object recursively (bytecode, constants including nested code, names), defaults, what its
  closure cells hold, and the functions, classes, modules and simple constants it names through
  its globals (recursively, bounded, each object once) — with the Python version;
- UncacheableError: something no digest can stand for (a closure or partial holding an arbitrary
  object, a builtin of a C library outside the standard library, a callable object of another
  kind). Its author can declare a salt for it.

What no digest shows: what the function reads when it is called — files, the environment,
globals that are not functions, classes, modules or constants (a dict, an object's attributes),
attributes of the modules it names. The digest is taken on every compile, so a redefined helper
(a notebook cell run again) is seen.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from typing import Any

import xxhash

from .._compat import tvm, tvm_ffi
from .._errors import UncacheableError
from .._version import __version__
from ..codegens._pyfunc import python_callable

__all__ = ["DECLARE_HINT", "code_owner", "declare_salt", "fingerprint", "identity", "in_tvm"]

_TVM_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (tvm, tvm_ffi))
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SIMPLE = (type(None), bool, int, float, complex, str, bytes)
# Bounds of one walk: deeper helpers, or more of them, are keyed by their names only.
_MAX_DEPTH = 8
_MAX_OBJECTS = 2000
DECLARE_HINT = "declare what it is with codegen_cache.declare_salt"
_HOW = ("declare what it is with codegen_cache.declare_salt(func, '<version>') before compiling, and change the "
        "salt whenever its behaviour changes")

# The callable (or ("id", id) where it is unhashable) -> (the callable, held; the salt as bytes).
_declared: dict[Any, tuple[Any, bytes]] = {}


def declare_salt(func: Any, salt: str | bytes) -> None:
    """Key `func` (registered into TVM: a global function, an op attribute, a pipeline) by `salt`, not by its code.

    Change the salt whenever what `func` returns changes (its code, or anything it reads when
    called). A tvm-ffi Function stands for the Python callable it wraps.
    """
    if not callable(func):
        raise TypeError(f"declare_salt expects a callable (a function, class or tvm-ffi Function), got {func!r} "
                        f"of type {type(func).__name__}")
    if not isinstance(salt, (str, bytes)):
        raise TypeError(f"salt must be a str or bytes, got {salt!r} of type {type(salt).__name__}")
    if not salt:
        raise ValueError(f"salt must not be empty, got {salt!r}")
    if isinstance(func, tvm_ffi.Function):
        inner = python_callable(func)
        if inner is None:
            raise TypeError(f"declare_salt expects a Python callable; {func!r} is a tvm-ffi Function of C++ code, "
                            "which no salt is needed for")
        func = inner
    _declared[_slot(func)] = (func, salt.encode() if isinstance(salt, str) else salt)


def _slot(obj: Any) -> Any:
    try:
        hash(obj)
    except TypeError:
        return ("id", id(obj))
    return obj


def _declared_salt(obj: Any) -> bytes | None:
    try:
        found = _declared.get(obj)
    except TypeError:
        found = _declared.get(("id", id(obj)))
    return None if found is None else found[1]


def identity(obj: Any, what: str) -> str | None:
    """None for TVM's own; else the hex digest of `obj` (module docstring); UncacheableError when unidentifiable.

    `what` names the registration in the error (e.g. "global function 'my.pass'").
    """
    walk = _Walk(what)
    walk.value(obj, 0, strict=True)
    if not walk.users:
        return None
    walk.digest.update(sys.version.encode())
    return walk.digest.hexdigest()


def fingerprint(obj: Any, what: str) -> str:
    """A digest of `obj` that tells any two different registrations apart, TVM's own included.

    TVM's code counts by where it is defined (its module, qualified name and line: the install
    digest pins the code there) and by what it holds (defaults, closure cells, a partial's or a
    bound method's values); a user's as identity() digests it. UncacheableError where `obj` holds
    something of a user's no digest stands for.
    """
    walk = _Walk(what, whole=True)
    walk.value(obj, 0, strict=True)
    walk.digest.update(sys.version.encode())
    return walk.digest.hexdigest()


@functools.lru_cache(maxsize=4096)
def code_owner(filename: str) -> str:
    """Whose code a file holds: 'tvm' (the installed tvm, tvm_ffi), 'own' (this package), 'library'
    (the standard library or an installed distribution: keyed by its name and version), else 'user'."""
    path = os.path.normpath(os.path.abspath(filename))
    if path.startswith(_TVM_DIRS):
        return "tvm"
    if path.startswith(_OWN_DIR):
        return "own"
    return "library" if path.startswith(_library_dirs()) else "user"


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """The standard library's and installed distributions' directories (sysconfig: imported at
    the first callable of a user's walked, not by `enable()`)."""
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(sorted({os.path.normpath(os.path.abspath(paths[name])) + os.sep
                         for name in ("stdlib", "purelib", "platlib")}))


def in_tvm(filename: str) -> bool:
    """Whether `filename` is code of the installed tvm or tvm_ffi package."""
    return code_owner(filename) == "tvm"


def _library_version(module: str | None) -> str:
    top = sys.modules.get((module or "").split(".")[0])
    return str(getattr(top, "__version__", "")) if top is not None else ""


class _Walk:
    """One digest over an object graph; `users` counts the non-TVM objects that went into it."""

    def __init__(self, what: str, *, whole: bool = False) -> None:
        self.what = what
        self.whole = whole  # fingerprint(): TVM's own code too, with what it holds
        self.digest = xxhash.xxh3_128()
        self.seen: dict[int, int] = {}
        self.held: list[Any] = []  # keeps every visited object alive, so no id is reused during the walk
        self.users = 0

    def put(self, *words: object) -> None:
        for word in words:
            data = word if isinstance(word, bytes) else str(word).encode()
            self.digest.update(len(data).to_bytes(8, "little") + data)

    def unidentifiable(self, reason: str) -> UncacheableError:
        return UncacheableError(self.what, reason, _HOW)

    def value(self, obj: Any, depth: int, *, strict: bool) -> None:
        """Digest `obj`; strict=False (a global it names) skips what cannot be identified instead of raising."""
        if isinstance(obj, _SIMPLE):
            self.put(type(obj).__name__, repr(obj))
            return
        if id(obj) in self.seen:
            self.put("ref", self.seen[id(obj)])
            return
        self.seen[id(obj)] = len(self.seen)
        self.held.append(obj)
        salt = _declared_salt(obj) if callable(obj) else None
        if salt is not None:
            self.users += 1
            self.put("declared", salt)
        elif isinstance(obj, types.FunctionType):
            self.function(obj, depth)
        elif isinstance(obj, type):
            self.klass(obj, depth)
        elif isinstance(obj, types.ModuleType):
            self.put("module", obj.__name__)
        elif isinstance(obj, (tuple, list, frozenset, set)):
            items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
            self.put(type(obj).__name__, len(items))
            for item in items:
                self.value(item, depth, strict=strict)
        elif isinstance(obj, dict):
            self.put("dict", len(obj))
            for k, v in obj.items():
                self.value(k, depth, strict=strict)
                self.value(v, depth, strict=strict)
        elif isinstance(obj, functools.partial):
            self.put("partial")
            self.value(obj.func, depth, strict=True)
            self.value(obj.args, depth, strict=True)
            self.value(obj.keywords, depth, strict=True)
        elif isinstance(obj, types.MethodType):
            self.put("method")
            self.value(obj.__func__, depth, strict=True)
            self.value(obj.__self__, depth, strict=True)
        elif isinstance(obj, (staticmethod, classmethod)):
            self.put(type(obj).__name__)
            self.value(obj.__func__, depth, strict=strict)
        elif isinstance(obj, types.CodeType):
            self.code(obj, depth)
        elif isinstance(obj, types.BuiltinFunctionType):
            self.builtin(obj, strict)
        elif isinstance(obj, tvm_ffi.Function):
            inner = python_callable(obj)
            if inner is None:
                if strict:
                    raise self.unidentifiable("it holds a tvm-ffi Function of C++ code no name stands for")
                return
            self.value(inner, depth, strict=strict)
        elif tvm_ffi.Object in type(obj).__mro__:
            # Not isinstance: tvm_ffi.Object is an ABC, whose first check of a type that is not
            # one walks every one of its subclasses (docs/benchmarks.md at 5788f7c, "The scan after enable()").
            self.tvm_object(obj, strict)
        elif strict:
            raise self.unidentifiable(f"it holds a {type(obj).__module__}.{type(obj).__qualname__} object, "
                                      "which no digest of code stands for")

    def function(self, func: types.FunctionType, depth: int) -> None:
        owner = code_owner(func.__code__.co_filename)
        self.put("function", owner, func.__module__, func.__qualname__)
        if owner == "own":
            self.put(__version__)
        elif owner == "library":
            self.put(_library_version(func.__module__))
        self.users += owner not in ("tvm", "own")
        bounded = depth > _MAX_DEPTH or len(self.seen) > _MAX_OBJECTS
        if owner != "user" and self.whole and not bounded:
            # Its code is keyed by the install (or a version); what it was made to hold is not:
            # TVM code bound to a user's value differs from the same code bound to TVM's.
            self.put(func.__code__.co_firstlineno)
            self.value(func.__defaults__, depth, strict=False)
            self.value(func.__kwdefaults__, depth, strict=False)
            for cell in func.__closure__ or ():
                self.cell(cell, depth, skip_values=False, strict=False)
            return
        if owner != "user" or bounded:
            # Keyed by a version (and, past the bounds, by name); a user's function may still be in its closure.
            for cell in func.__closure__ or ():
                self.cell(cell, depth, skip_values=True)
            return
        self.code(func.__code__, depth)
        self.value(func.__defaults__, depth, strict=True)
        self.value(func.__kwdefaults__, depth, strict=True)
        for cell in func.__closure__ or ():
            self.cell(cell, depth, skip_values=False)
        scope = func.__globals__
        for name in sorted(_global_names(func.__code__)):
            if name in scope:
                self.put("global", name)
                self.value(scope[name], depth + 1, strict=False)

    def cell(self, cell: types.CellType, depth: int, *, skip_values: bool, strict: bool | None = None) -> None:
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell (a name assigned later)
            self.put("empty-cell")
            return
        if skip_values and not callable(content):
            return
        self.value(content, depth + 1, strict=not skip_values if strict is None else strict)

    def code(self, code: types.CodeType, depth: int) -> None:
        self.put("code", code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                 code.co_argcount, code.co_kwonlyargcount, code.co_flags)
        for const in code.co_consts:
            self.value(const, depth, strict=True)

    def klass(self, klass: type, depth: int) -> None:
        owner = "library" if klass.__module__ == "builtins" else \
            code_owner(getattr(sys.modules.get(klass.__module__), "__file__", None) or "<unknown>")
        self.put("class", owner, klass.__module__, klass.__qualname__)
        if owner == "library":
            self.put(_library_version(klass.__module__))
        self.users += owner not in ("tvm", "own")
        if owner != "user" or depth > _MAX_DEPTH or len(self.seen) > _MAX_OBJECTS:
            return
        for base in klass.__bases__:
            self.value(base, depth + 1, strict=False)
        for name, attribute in sorted(vars(klass).items()):
            if name in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__"):
                continue
            self.put("attribute", name)
            self.value(attribute, depth + 1, strict=False)

    def builtin(self, func: types.BuiltinFunctionType, strict: bool) -> None:
        owner = getattr(func, "__self__", None)
        module = owner.__name__ if isinstance(owner, types.ModuleType) else getattr(func, "__module__", None)
        top = (module or "").split(".")[0].lstrip("_")
        if owner is None or isinstance(owner, types.ModuleType):
            if top in sys.stdlib_module_names or top == "builtins":
                self.users += 1
                self.put("builtin", module, func.__qualname__)  # keyed by the Python version
                return
        if strict:
            raise self.unidentifiable(f"it is (or holds) {func!r}, a builtin of a C library whose version no key "
                                      "part holds")

    def tvm_object(self, obj: Any, strict: bool) -> None:
        try:
            self.put("tvm-object", type(obj).__qualname__, tvm_ffi.structural_hash(obj, map_free_vars=True))
        except (TypeError, ValueError, RuntimeError) as err:
            if strict:
                raise self.unidentifiable(f"it holds a {type(obj).__qualname__} that TVM cannot hash ({err})") from err


def _global_names(code: types.CodeType) -> set[str]:
    """The global names `code` and the code nested in it may load."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
