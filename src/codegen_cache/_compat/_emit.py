"""TVM's LLVM object emission for the llvm upgrader, through tvm-ffi's public API without `import tvm`.

The llvm upgrader (_cache/_upgrade.py) needs two of TVM's global functions, both C++:
`ffi.Module.load_from_file.ll` (parse LLVM IR text into TVM's llvm module) and
`ffi.ModuleWriteToFile` (emit its object file). `import tvm` would bring TVM's whole Python
package for two calls; instead the helper loads the shared libraries of the TVM that made the
IR (`tvm_libraries()`, read in the process that starts it), whose static initializers register
those functions with tvm-ffi, and calls them through `tvm_ffi.get_global_func`. Nothing here
reads tvm-ffi's objects by their memory layout: arguments, results and errors cross through
tvm-ffi's own Python package (a TVM error arrives as the Python exception tvm-ffi raises for it).
The object file is the one `import tvm` would have made: tests/test_upgrade_emit.py compares
them byte for byte.
"""

from __future__ import annotations

import ctypes
import os
import re

__all__ = ["emit_object", "tvm_libraries"]

# TVM's shared libraries by file name: apache-tvm's split ones, tilelang's libtvm.so, tvm-ffi's.
_TVM_LIBRARY = re.compile(r"^lib(tvm_ffi|tvm|tvm_runtime|tvm_compiler)\.so$")


def tvm_libraries() -> list[str]:
    """The TVM shared libraries mapped into this process, tvm-ffi's first; [] where none is (or no /proc)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = [line.split(None, 5)[5].strip() for line in maps if line.count(" ") >= 5 and "/" in line]
    except OSError:
        return []
    found = []
    for path in paths:
        if path not in found and _TVM_LIBRARY.match(os.path.basename(path)) and os.path.isfile(path):
            found.append(path)
    # tvm-ffi first, then the runtime, then the compiler: each library's own dependencies load with it.
    return sorted(found, key=lambda p: (0 if "tvm_ffi" in p else 1 if "runtime" in p else 2, p))


_loaded: list[str] = []


def _global_function(libraries: list[str], name: str):
    """TVM's global function `name`, once the libraries given are loaded in this process."""
    # Imported here, not with the module: only the upgrader calls TVM, and tvm-ffi's package comes
    # first, so that its own libtvm_ffi.so is the registry the TVM libraries register into (the
    # process that started this one loaded the same file).
    import tvm_ffi

    if not _loaded:
        if not libraries:
            raise OSError("no TVM shared library was named (the process that started this one had none loaded)")
        for path in libraries:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        _loaded[:] = libraries
    func = tvm_ffi.get_global_func(name, allow_missing=True)
    if func is None:
        raise OSError(f"TVM has no global function {name!r} in {[os.path.basename(p) for p in _loaded]}")
    return func


def emit_object(libraries: list[str], ir_path: str, object_path: str) -> None:
    """Write the object file of the LLVM IR text at `ir_path`, as TVM's llvm module emits it."""
    steps = (("ffi.Module.load_from_file.ll", lambda f, _: f(ir_path, "ll")),
             ("ffi.ModuleWriteToFile", lambda f, module: f(module, object_path, "o")))
    value = None
    for name, call in steps:
        func = _global_function(libraries, name)
        try:
            value = call(func, value)
        # tvm-ffi raises a TVM error as the Python exception of its kind (InternalError is a
        # RuntimeError; a bad argument a ValueError or TypeError).
        except (RuntimeError, ValueError, TypeError) as err:
            message = str(err).strip().splitlines()[-1:] or ["(no message)"]
            raise RuntimeError(f"TVM's {name} failed: {message}"[:500]) from err
