"""TVM's LLVM object emission through tvm-ffi's C ABI, for a process that does not import TVM.

The llvm upgrader (_cache/_upgrade.py) needs two of TVM's global functions, both C++:
`ffi.Module.load_from_file.ll` (parse LLVM IR text into TVM's llvm module) and
`ffi.ModuleWriteToFile` (emit its object file). `import tvm` would bring TVM's whole Python
package, numpy and ml_dtypes with them, for two calls; instead the helper maps the shared
libraries of the TVM that made the IR (`tvm_libraries()`, read in the process that starts it)
and calls the functions through tvm-ffi's C ABI (`tvm/ffi/c_api.h`: TVMFFIFunctionGetGlobal,
TVMFFIFunctionCall, TVMFFIObjectDecRef, TVMFFIErrorMoveFromRaised and the TVMFFIAny layout),
the ABI tvm-ffi keeps stable across its releases (docs/maintaining.md). The object file is the
one `import tvm` would have made: tests/test_upgrade_abi.py compares them byte for byte.
"""

from __future__ import annotations

import ctypes
import os
import re

__all__ = ["emit_object", "tvm_libraries"]

# TVM's shared libraries by file name: apache-tvm's split ones, tilelang's libtvm.so, tvm-ffi's.
_TVM_LIBRARY = re.compile(r"^lib(tvm_ffi|tvm|tvm_runtime|tvm_compiler)\.so$")
_RAW_STR = 8  # kTVMFFIRawStr: a NUL-terminated char* argument
_HEADER = 24  # sizeof(TVMFFIObject): what an Error object's TVMFFIErrorCell follows


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


class _ByteArray(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Any(ctypes.Structure):
    _fields_ = [("type_index", ctypes.c_int32), ("zero_padding", ctypes.c_uint32), ("value", ctypes.c_void_p)]


class _Ffi:
    """The C functions of the libraries given, loaded once per process."""

    def __init__(self, libraries: list[str]) -> None:
        if not libraries:
            raise OSError("no TVM shared library was named (the process that started this one had none loaded)")
        loaded = [ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL) for path in libraries]
        self.lib = next((lib for lib in loaded if hasattr(lib, "TVMFFIFunctionCall")), None)
        if self.lib is None:
            raise OSError(f"none of {libraries} exports tvm-ffi's C ABI (TVMFFIFunctionCall)")
        self.lib.TVMFFIFunctionGetGlobal.argtypes = [ctypes.POINTER(_ByteArray), ctypes.POINTER(ctypes.c_void_p)]
        self.lib.TVMFFIFunctionCall.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Any), ctypes.c_int32,
                                                ctypes.POINTER(_Any)]
        self.lib.TVMFFIObjectDecRef.argtypes = [ctypes.c_void_p]
        self.lib.TVMFFIErrorMoveFromRaised.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.functions: dict[str, ctypes.c_void_p] = {}

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self.functions:
            data = name.encode()
            handle = ctypes.c_void_p()
            self._check(self.lib.TVMFFIFunctionGetGlobal(ctypes.byref(_ByteArray(ctypes.cast(data, ctypes.c_void_p),
                                                                                  len(data))),
                                                          ctypes.byref(handle)), name)
            if not handle.value:
                raise OSError(f"TVM has no global function {name!r} in {[os.path.basename(p) for p in _loaded]}")
            self.functions[name] = handle
        return self.functions[name]

    def call(self, name: str, *args: str | _Any) -> _Any:
        """Call a global function with str (or Any) arguments; the result (owned by the caller)."""
        texts = [ctypes.c_char_p(a.encode()) for a in args if isinstance(a, str)]
        packed, strings = (_Any * len(args))(), iter(texts)
        for slot, arg in zip(packed, args):
            if isinstance(arg, str):
                slot.type_index, slot.value = _RAW_STR, ctypes.cast(next(strings), ctypes.c_void_p)
            else:
                slot.type_index, slot.zero_padding, slot.value = arg.type_index, arg.zero_padding, arg.value
        result = _Any(0, 0, None)  # kTVMFFINone, as the ABI asks of a call's result
        self._check(self.lib.TVMFFIFunctionCall(self.function(name), packed, len(args), ctypes.byref(result)), name)
        return result

    def release(self, value: _Any) -> None:
        if value.type_index >= 64 and value.value:  # kTVMFFIStaticObjectBegin: a reference counted object
            self.lib.TVMFFIObjectDecRef(value.value)

    def _check(self, status: int, name: str) -> None:
        if status == 0:
            return
        error = ctypes.c_void_p()
        self.lib.TVMFFIErrorMoveFromRaised(ctypes.byref(error))
        message = ""
        if error.value:
            # TVMFFIErrorCell after the object header: kind, then message (each a TVMFFIByteArray).
            cell = (_ByteArray * 2).from_address(error.value + _HEADER)
            message = ctypes.string_at(cell[1].data, cell[1].size).decode("utf-8", "replace") if cell[1].data else ""
            self.lib.TVMFFIObjectDecRef(error)
        raise RuntimeError(f"TVM's {name} failed: {message.strip().splitlines()[-1:] or ['(no message)']}"[:500])


_loaded: list[str] = []
_ffi: _Ffi | None = None


def emit_object(libraries: list[str], ir_path: str, object_path: str) -> None:
    """Write the object file of the LLVM IR text at `ir_path`, as TVM's llvm module emits it."""
    global _ffi
    if _ffi is None:
        _ffi = _Ffi(libraries)
        _loaded[:] = libraries
    module = _ffi.call("ffi.Module.load_from_file.ll", ir_path, "ll")
    try:
        _ffi.release(_ffi.call("ffi.ModuleWriteToFile", module, object_path, "o"))
    finally:
        _ffi.release(module)
