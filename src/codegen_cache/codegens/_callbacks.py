"""Callbacks: the Python global functions TVM's codegens call, keyed by whose they are.

TVM's C++ codegens look these names up while they run and call whatever is registered under
them, so the registered function is an input of the codegen. A key records, per callback a
codegen reaches, one identity:
- nothing registered: `none`;
- a salt declared for the registered function (`declare_callback_salt`): `declared:<salt>`;
- TVM's own function (defined in the installed tvm package, _owner.py): `tvm <version>: module.name`;
- anything else, a user's function of any kind: UncacheableError, so the cache neither stores
  nor serves that codegen's results. What a Python function returns may depend on what it reads
  when it is called (the environment, files, other modules' attributes, the clock): only its
  author can say what determines it, with a salt (as Inductor bypasses its cache for a custom
  pass without a uuid()).

The hit path stays cheap: identities are memoized per registered function object (held, so its
address is never reused while memoized), and each lookup compares handles only.
"""

from __future__ import annotations

import functools
from typing import Any

from .. import _compat
from .._errors import UncacheableError
from ._owner import TVM_DIR, owner_name, tvm_name

__all__ = ["CALLBACKS", "EXCLUDED_GLOBALS", "TILELANG_PREFIX", "TVM_HOMES", "callback_identity", "callback_parts", "callback_salts",
           "declare_callback_salt", "declare_salt_of", "declared_salt", "tvm_name", "users_function"]

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
# Where TVM 0.27 defines its own functions for these names: the modules that hold each one's
# Function as an attribute (_owner.owner_name; elsewhere the function's code file tells).
TVM_HOMES: dict[str, tuple[str, ...]] = {
    "tvm_callback_cuda_compile": ("tvm.support.nvcc",),
    "tvm_callback_libdevice_path": ("tvm.support.nvcc",),
    "tvm.support.nvcc.get_compute_version": ("tvm.support.nvcc",),
    "tvm_callback_rocm_link": ("tvm.support.rocm",),
    "tvm_callback_rocm_bitcode_path": ("tvm.support.rocm",),
    "tvm_callback_rocm_get_arch": ("tvm.support.rocm",),
    "tirx.intrinsics.cuda.get_codegen": ("tvm.backend.cuda.codegen.registry",),
    "tirx.intrinsics.cuda.header_generator": ("tvm.backend.cuda.codegen.header",),
}
# tilelang's codegens call Python global functions named so (tilelang/_salts.py keys them).
TILELANG_PREFIX = "tilelang_callback_"
# Python global functions named in TVM's codegen libraries that no device codegen calls.
EXCLUDED_GLOBALS: dict[str, str] = {
    "tirx.f_op_dispatcher": "a lowering pass (TilePrimitiveDispatch): its effect is in the IR the key hashes",
    "tirx.build": "the build driver (tvm.tirx.build), which calls codegens; not called by one",
    "relax.run.*": "Relax VM runtime builtins",
    "s_tir.meta_schedule.*": "MetaSchedule tuning",
    "tvm.s_tir.meta_schedule.*": "MetaSchedule tuning",
}


# tvm_ffi's own lookup: the same answer as tvm.get_global_func, faster (this runs several times
# per key).
_registered = _compat.tvm_ffi.get_global_func


def callback_salts(*names: str) -> dict[str, str]:
    """Key parts `callback:<name>` = identity of what is registered under each name now."""
    return dict(callback_parts(names))


def callback_parts(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """callback_salts' items; the same tuple object while nothing they were computed from changed.

    Memoized per names tuple and re-checked on every call: each name is looked up again and
    compared by handle with the function the identity was computed from (held, so its address
    is not reused), and any declared salt invalidates it.
    """
    funcs = [_registered(name, allow_missing=True) for name in names]
    memo = _parts_memo.get(names)
    if memo is not None and memo[0] == _generation[0] and _still(funcs, memo[1]):
        return memo[2]
    generation = _generation[0]
    found = [_identity_of(name, func) for name, func in zip(names, funcs)]
    parts = tuple((_part(name), identity) for name, (identity, _) in zip(names, found))
    if len(_parts_memo) >= 64:
        _parts_memo.clear()
    _parts_memo[names] = (generation, tuple(zip(funcs, (entry for _, entry in found))), parts)
    return parts


def _still(funcs: list, held: tuple) -> bool:
    for func, (old, _entry) in zip(funcs, held):
        if func is None or old is None:
            if func is not old:
                return False
        elif func.__chandle__() != old.__chandle__():
            return False
    return True


@functools.lru_cache(maxsize=None)
def _part(name: str) -> str:
    return f"callback:{name}"


def callback_identity(name: str) -> str:
    """The identity of the function registered under `name` (see the module docstring)."""
    return _identity_of(name, _registered(name, allow_missing=True))[0]


def _identity_of(name: str, func: Any) -> tuple[str, tuple | None]:
    # (identity, the memo entry it came from: None where nothing registered or a salt is declared)
    if func is None:
        return "none", None
    handle = func.__chandle__()
    declared = _declared.get(handle)
    if declared is not None:
        return f"declared:{declared[1]}", None
    known = _known.get(handle)
    if known is None:
        known = _identify(name, func)
        if len(_known) >= 256:
            _known.clear()
        _known[handle] = known
    if known[2] is not None:
        raise known[2]
    return known[1], known


def users_function(what: str, salt_name: str) -> UncacheableError:
    """The error for a user's function that a codegen calls (`what`), whose remedy is a salt for `salt_name`."""
    return UncacheableError(
        what, "it is a user's function: what it returns may depend on what it reads when called (the "
        "environment, files, other modules), which its code does not show",
        f"declare what it is with codegen_cache.declare_callback_salt({salt_name!r}, '<version>') after "
        "registering it, and change the salt whenever its behaviour changes",
    )


def declared_salt(name: str) -> str | None:
    """The salt declared for the function registered under `name` now, or None."""
    func = _registered(name, allow_missing=True)
    found = None if func is None else _declared.get(func.__chandle__())
    return None if found is None else found[1]


def declare_callback_salt(name: str, salt: str | bytes) -> None:
    """Key the function registered under `name` now by `salt`: how a user's hook becomes cacheable.

    Change the salt whenever what the function returns changes (its code, or anything it reads:
    files, environment variables, other modules). The declaration holds for this registration
    only: registering another function under `name` needs a new declaration. `name`: one of
    CALLBACKS, or a tilelang_callback_* name (tilelang's codegens call those).
    """
    if name not in CALLBACKS and not name.startswith(TILELANG_PREFIX):
        raise ValueError(f"Unknown callback {name!r}. TVM's codegens call: {sorted(CALLBACKS)}; "
                         f"tilelang's call {TILELANG_PREFIX}*.")
    declare_salt_of(name, salt)


def declare_salt_of(name: str, salt: str | bytes) -> None:
    """declare_callback_salt for a name outside TVM's table (tilelang's tilelang_callback_*)."""
    if not isinstance(salt, (str, bytes)):
        raise TypeError(f"salt must be a str or bytes, got {salt!r} of type {type(salt).__name__}")
    if not salt:
        raise ValueError(f"salt must be a non-empty str or bytes, got {salt!r}")
    if isinstance(salt, bytes):
        salt = salt.decode("utf-8", "backslashreplace")
    func = _registered(name, allow_missing=True)
    if func is None:
        raise ValueError(f"No function is registered under {name!r}: register it first, then declare its salt.")
    # The Function is held, so its address (the memo key) is not reused while declared.
    _declared[func.__chandle__()] = (func, salt)


# handle -> (Function, salt) and handle -> (Function, identity, error); the Function is
# held so that no other function can be created at the same address while its entry exists.
class _Declarations(dict):
    """handle -> (Function, salt); every change bumps _generation (the function is the same
    object, so callback_parts' memo must not hold across a declaration, or its removal)."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        _generation[0] += 1

    def __delitem__(self, key):
        super().__delitem__(key)
        _generation[0] += 1

    def pop(self, *args):
        _generation[0] += 1
        return super().pop(*args)

    def popitem(self):
        _generation[0] += 1
        return super().popitem()

    def clear(self):
        _generation[0] += 1
        super().clear()

    def update(self, *args, **kwargs):
        _generation[0] += 1
        super().update(*args, **kwargs)

    def setdefault(self, *args):
        _generation[0] += 1
        return super().setdefault(*args)


_declared: dict[int, tuple[Any, str]] = _Declarations()
_known: dict[int, tuple[Any, str, UncacheableError | None]] = {}
# names -> (generation, ((Function or None, _known entry or None) per name), parts)
_parts_memo: dict[tuple[str, ...], tuple[int, tuple, tuple[tuple[str, str], ...]]] = {}
_generation = [0]  # bumped by every change of _declared


def _identify(name: str, func: Any) -> tuple[Any, str, UncacheableError | None]:
    own = owner_name(func, TVM_DIR, TVM_HOMES.get(name, ()))
    if own is not None:
        return func, f"tvm {_compat.tvm_version()}: {own}", None
    return func, "", users_function(f"callback {name!r}", name)
