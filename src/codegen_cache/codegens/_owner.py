"""Whose function a callback is: TVM's own, tilelang's own, or a user's.

Only the first two can be keyed without the user's help (by their version): what a user's
function returns may depend on what it reads when it is called (the environment, files, other
modules' attributes, the clock), and no digest of its code, defaults, closures or globals
shows that. So a user's hook is keyed only by a salt its author declares.

Told apart through public API where it can be: tvm_ffi's `register_global_func`, used as a
decorator, leaves the Function it registered as the attribute of the module that defines it, so
TVM's own callback is the very Function object (same handle) found at its home in the installed
tvm package (`owner_name`'s `homes`; nothing is imported). Where that finds nothing (a
registration by call, `register_global_func(name, f)`, as tilelang registers its callbacks, or
another TVM whose modules are laid out otherwise), the Python callable behind the Function is
read from the object (_pyfunc.py: tvm-ffi has no API that hands it back), and the file its code
was defined in says whose it is. An unknown tvm-ffi layout yields no callable: a user's, never
misidentified.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterable
from typing import Any

from .._compat import tvm, tvm_ffi
from ._pyfunc import python_callable

__all__ = ["TVM_DIR", "owner_name", "tvm_name"]

TVM_DIR = os.path.dirname(os.path.abspath(tvm.__file__)) + os.sep
_Function = tvm_ffi.Function


def owner_name(func: Any, package_dir: str, homes: Iterable[str] = (), *, closures: bool = False) -> str | None:
    """`module.name` of the tvm-ffi Function `func` where a package in `package_dir` defines it, else None.

    `homes`: modules of that package that may hold it as an attribute (checked first, by handle).
    closures=True: a closure made by the package's code counts as the package's too (for
    tilelang, which registers its callbacks as closures; TVM registers none, so there a closure
    is a wrapper around a user's function).
    """
    handle = func.__chandle__()
    for home in homes:
        module = sys.modules.get(home)
        if module is None or not _inside(getattr(module, "__file__", None), package_dir):
            continue
        for attr, value in vars(module).items():
            if isinstance(value, _Function) and value.__chandle__() == handle:
                return f"{home}.{attr}"
    target = python_callable(func)
    code = getattr(target, "__code__", None)
    if isinstance(target, types.FunctionType) and (closures or not target.__closure__) \
            and _inside(code.co_filename, package_dir):
        # A closure would hold values from wherever it was made: the package's code around a user's.
        return f"{target.__module__}.{target.__qualname__}"
    return None


def tvm_name(obj: Any) -> str | None:
    """module.qualname of a Python function or class defined in the installed tvm package, else None."""
    code = getattr(obj, "__code__", None)
    module = getattr(obj, "__module__", None)
    if isinstance(obj, types.FunctionType) and code is not None and code.co_filename.startswith(TVM_DIR):
        return f"{module}.{obj.__qualname__}"
    if isinstance(obj, type) and isinstance(module, str) and module.split(".")[0] in ("tvm", "tvm_ffi"):
        return f"{module}.{obj.__qualname__}"
    return None


def _inside(path: str | None, package_dir: str) -> bool:
    return path is not None and os.path.normpath(os.path.abspath(path)).startswith(package_dir)
