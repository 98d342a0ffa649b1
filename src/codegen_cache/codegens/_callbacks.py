"""Callbacks: the Python global functions TVM's codegens call, keyed by what they are.

TVM's C++ codegens look these names up while they run and call whatever is registered under
them, so the registered function is an input of the codegen. A key records, per callback a
codegen reaches, one identity:
- nothing registered: `none`;
- a salt declared for the registered function (`declare_callback_salt`): `declared:<salt>`;
- TVM's own function (defined in the installed tvm package): `tvm <version>: module.qualname`;
- any other Python function: `code:<digest>` of its code objects (bytecode, constants, names,
  recursively through nested code), defaults, and the values it closes over or reads as
  globals, where those are plain data, modules, functions (digested the same way), or
  functions and classes of the standard library or TVM (by name);
- anything else (a C function, a bound method, a closure over an object, a callable
  instance): UncacheableError, so the cache neither stores nor serves that codegen's results.

The hit path stays cheap: identities are memoized per registered function object (held, so
its address is never reused while memoized) and re-checked by identity (`is`) against every
cell, global, code object and defaults tuple they were computed from.
"""

from __future__ import annotations

import builtins
import ctypes
import functools
import os
import sys
import sysconfig
import types
from typing import Any

import xxhash

from .. import _compat
from .._compat import tvm
from .._errors import UncacheableError

__all__ = ["CALLBACKS", "EXCLUDED_GLOBALS", "callback_identity", "callback_salts", "declare_callback_salt",
           "declare_salt_of", "declared_salt", "object_identity", "tvm_name", "unchanged"]

# The Python global functions TVM 0.27's codegen libraries call: every tvm_callback_* name in
# them, and the other names they look up that TVM registers from Python. tests/
# test_key_callbacks.py fails when the installed TVM's libraries name one that is neither here
# nor in EXCLUDED_GLOBALS.
CALLBACKS: dict[str, str] = {
    "tvm_callback_cuda_postproc": "target.build.cuda: rewrites the generated CUDA source",
    "tvm_callback_cuda_compile": "target.build.cuda with TVM's CUDA runtime loaded: compiles the source "
    "(tvm.support.nvcc); the built-in cuda codegens never reach it (TVM_COMPILE_FORCE_FALLBACK, nvcc)",
    "tvm_callback_opencl_postproc": "target.build.opencl: rewrites the generated OpenCL source",
    "tvm_callback_metal_compile": "target.build.metal: compiles (or rewrites) the generated Metal source",
    "tvm_callback_libdevice_path": "target.build.nvptx: the libdevice file to link (tvm.support.nvcc)",
    "tvm_callback_rocm_link": "target.build.rocm: links the object into a code object (tvm.support.rocm)",
    "tvm_callback_rocm_bitcode_path": "target.build.rocm: the ROCm device libraries (tvm.support.rocm)",
    "tvm_callback_rocm_get_arch": "target.build.rocm without -mcpu: the local GPU's arch (tvm.support.rocm)",
    "tvm_callback_Trainium_compile": "the Trainium codegen, which this package does not wrap",
    "tvm.support.nvcc.get_compute_version": "target.build.cuda: the arch, for arch-dependent code",
    "tirx.intrinsics.cuda.get_codegen": "target.build.cuda: the code of each CUDA device intrinsic (its "
    "table, tvm.backend.cuda.codegen.CODEGEN_REGISTRY, is keyed as cuda_intrinsics)",
    "tirx.intrinsics.cuda.header_generator": "target.build.cuda: the #include header of the source",
}
# Python global functions named in TVM's codegen libraries that no device codegen calls.
EXCLUDED_GLOBALS: dict[str, str] = {
    "tirx.f_op_dispatcher": "a lowering pass (TilePrimitiveDispatch): its effect is in the IR the key hashes",
    "tirx.build": "the build driver (tvm.tirx.build), which calls codegens; not called by one",
    "relax.run.*": "Relax VM runtime builtins",
    "s_tir.meta_schedule.*": "MetaSchedule tuning",
    "tvm.s_tir.meta_schedule.*": "MetaSchedule tuning",
}

_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_MISSING = object()
_CELL = object()
_TVM_DIR = os.path.dirname(os.path.abspath(tvm.__file__)) + os.sep
_STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
_MAX_NODES = 400


# tvm_ffi's own lookup: the same answer as tvm.get_global_func, in 60% of the time (this runs
# several times per key).
_registered = _compat.tvm_ffi.get_global_func


def callback_salts(*names: str) -> dict[str, str]:
    """Key parts `callback:<name>` = identity of what is registered under each name now."""
    return {_part(name): callback_identity(name) for name in names}


@functools.lru_cache(maxsize=None)
def _part(name: str) -> str:
    return f"callback:{name}"


def callback_identity(name: str) -> str:
    """The identity of the function registered under `name` (see the module docstring)."""
    func = _registered(name, allow_missing=True)
    if func is None:
        return "none"
    handle = func.__chandle__()
    declared = _declared.get(handle)
    if declared is not None:
        return f"declared:{declared[1]}"
    known = _known.get(handle)
    if known is None or not _unchanged(known[3]):
        known = _identify(name, func)
        if len(_known) >= 256:
            _known.clear()
        _known[handle] = known
    if known[2] is not None:
        raise known[2]
    return known[1]


def object_identity(obj: Any, what: str, salt_name: str) -> tuple[str, tuple]:
    """The identity of a Python callable a codegen reads other than through a global function.

    Returns (identity, watch): the watch holds what the identity was computed from, for
    `unchanged(watch)`. Raises UncacheableError naming `what`; its remedy declares a salt for
    the global function `salt_name`.
    """
    digest = _Digest(salt_name, what)
    return digest.identity(obj), tuple(digest.watch)


def declared_salt(name: str) -> str | None:
    """The salt declared for the function registered under `name` now, or None."""
    func = _registered(name, allow_missing=True)
    found = None if func is None else _declared.get(func.__chandle__())
    return None if found is None else found[1]


def unchanged(watch: tuple) -> bool:
    """True while every object an identity was computed from is still the same object."""
    return _unchanged(watch)


def declare_callback_salt(name: str, salt: str) -> None:
    """Key the function registered under `name` now by `salt` instead of by what it is.

    For a callback whose identity cannot be computed (a C function, a closure over an object):
    change the salt whenever its behaviour changes. The declaration holds for this registration
    only: registering another function under `name` needs a new declaration.
    """
    if name not in CALLBACKS:
        raise ValueError(f"Unknown callback {name!r}. TVM's codegens call: {sorted(CALLBACKS)}.")
    declare_salt_of(name, salt)


def declare_salt_of(name: str, salt: str) -> None:
    """declare_callback_salt for a name outside TVM's table (tilelang's tilelang_callback_*)."""
    if not isinstance(salt, str) or not salt:
        raise ValueError(f"salt must be a non-empty str, got {salt!r}")
    func = _registered(name, allow_missing=True)
    if func is None:
        raise ValueError(f"No function is registered under {name!r}: register it first, then declare its salt.")
    # The Function is held, so its address (the memo key) is not reused while declared.
    _declared[func.__chandle__()] = (func, salt)


# handle -> (Function, salt) and handle -> (Function, identity, error, watch); the Function is
# held so that no other function can be created at the same address while its entry exists.
_declared: dict[int, tuple[Any, str]] = {}
_known: dict[int, tuple[Any, str, UncacheableError | None, tuple]] = {}


def _identify(name: str, func: Any) -> tuple[Any, str, UncacheableError | None, tuple]:
    target = python_callable(func)
    digest = _Digest(name)
    try:
        if target is None:
            raise digest.uncacheable("it is not a Python function (a C/C++ function, or an unknown tvm-ffi layout)")
        identity = digest.identity(target)
        return func, identity, None, tuple(digest.watch)
    except UncacheableError as err:
        return func, "", err, tuple(digest.watch)


def _unchanged(watch: tuple) -> bool:
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


class _Digest:
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


# ---- the Python callable behind a tvm-ffi Function ----------------------------------------

_WORDS = 8


def _words(handle: int) -> list[int]:
    return [ctypes.c_uint64.from_address(handle + 8 * i).value for i in range(_WORDS)]


@functools.lru_cache(maxsize=1)
def _layout() -> tuple[int, bool, tuple[tuple[int, int], ...]] | None:
    """Where a Function made from a Python callable keeps it, learnt from two probe functions.

    Returns (word offset, whether that word points at a closure whose first word is the
    callable, the (offset, value) words every such Function shares), or None when the layout
    is not recognized (then every registered callback is uncacheable, never misidentified).
    """
    from .._compat import tvm_ffi

    def probe_a():
        return "a"

    def probe_b():
        return "b"

    fa, fb = tvm_ffi.convert(probe_a), tvm_ffi.convert(probe_b)
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
