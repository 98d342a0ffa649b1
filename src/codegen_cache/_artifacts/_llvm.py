"""LLVM modules as stored artifacts: LLVM IR text (the raw form) and a shared library (the fast form).

TVM's LLVM module cannot be saved to bytes. A built module is stored at once as its LLVM IR
text (`inspect_source("ll")`, in memory: nothing LLVM writes can fail there), which TVM loads
back by re-parsing it. A helper process later turns the IR into a shared library, linked the
way `export_library` links (`$CXX`/`$CC` or g++, `-shared -fPIC`), which a hit maps with
dlopen in microseconds. LLVM aborts the whole process on an I/O error while it emits an
object file, so that step never runs in the user's process.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence

from .. import _compat
from .._compat import Module, tvm
from ._private import SCRATCH_PREFIX, load_private_copy

__all__ = [
    "SCRATCH_PREFIX",
    "CachedIRModule",
    "CachedLibraryModule",
    "compiler_command",
    "load_ir",
    "load_library",
    "shared_library_from_ir",
]

_COMPILERS = ("g++", "gcc", "clang++", "clang", "c++", "cc")  # tvm.support.cc.get_cc's order
_FFI_PREFIX = "__tvm_ffi_"


def compiler_command(environ: dict[str, str] | None = None) -> list[str]:
    """The command that links a shared library: $CXX or $CC split as a shell would, else g++ ...

    TVM's get_cc picks the same compiler, but runs "$CC" as one word, so `CC="ccache gcc"`
    fails there; here it is a command line, as in distutils.
    """
    environ = os.environ if environ is None else environ
    text = environ.get("CXX") or environ.get("CC")
    if text and text.strip():
        return shlex.split(text)
    for name in _COMPILERS:
        path = shutil.which(name)
        if path:
            return [path]
    return []


def shared_library_from_ir(llvm_ir: str, scratch: str, *, compiler: list[str] | None = None,
                           timeout: float = 600.0) -> bytes:
    """Emit an object file from LLVM IR and link it into a shared library (helper process only)."""
    command = compiler_command() if compiler is None else compiler
    if not command or shutil.which(command[0]) is None:
        raise OSError(f"no C compiler to link a shared library (tried $CXX, $CC, {', '.join(_COMPILERS)}; "
                      f"got {' '.join(command) or 'nothing'})")
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=scratch) as tmp:
        ir, obj, lib = (os.path.join(tmp, name) for name in ("lib.ll", "lib.o", "lib.so"))
        with open(ir, "w") as f:
            f.write(llvm_ir)
        _compat.builtin_func("ffi.Module.load_from_file.ll")(ir, "ll").write_to_file(obj)
        # Its own session: Ctrl-C in a terminal or a Jupyter interrupt (SIGINT to the process
        # group) must not kill the linker halfway.
        done = subprocess.run([*command, "-shared", "-fPIC", "-o", lib, obj], capture_output=True, text=True,
                              timeout=timeout, start_new_session=True, check=False)
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} -shared failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        with open(lib, "rb") as f:
            return f.read()


class CachedIRModule(tvm.runtime.Module):
    """An llvm module parsed from cached LLVM IR: it runs and exports as the built one.

    TVM's module from IR text does not know its functions' names until it compiles them, so
    `implements_function` answers from the symbols recorded with the entry, by TVM's rule for
    llvm modules (function `name` is the symbol `__tvm_ffi_<name>`).
    """

    def implements_function(self, name, query_imports=False):
        """Whether the module (or, with query_imports, an import) has function `name`."""
        if _FFI_PREFIX + name in self._cgc_names:
            return True
        return super().implements_function(name, query_imports)

    def inspect_source(self, fmt=""):
        """The source in `fmt`; LLVM IR ("ll") is the stored text, the built module's byte for byte."""
        if fmt == "ll":
            return self._cgc_ir  # printing the parsed module reorders comments and renames it
        return super().inspect_source(fmt)


def load_ir(llvm_ir: str, scratch: str, func_names: Sequence[str] = ()) -> CachedIRModule:
    """An LLVM module from IR text (TVM parses it again; functions are JIT-compiled on first use)."""
    fd, path = tempfile.mkstemp(prefix=SCRATCH_PREFIX, suffix=".ll", dir=scratch)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(llvm_ir)
        module = _compat.builtin_func("ffi.Module.load_from_file.ll")(path, "ll")
    finally:
        os.unlink(path)
    cached = CachedIRModule.__new__(CachedIRModule)
    cached.__move_handle_from__(module)
    cached._cgc_names = frozenset(func_names)
    cached._cgc_ir = llvm_ir
    return cached


class CachedLibraryModule(tvm.runtime.Module):
    """A module mapped from a cached shared library: runs like the built one, and exports.

    `export_library` writes the stored library itself where that is what TVM would write (no
    imports, default options); otherwise it rebuilds the LLVM module from the stored IR and
    lets TVM export that, so the result is what a fresh build's export gives.
    """

    def export_library(self, file_name, *, fcompile=None, fpack_imports=None, addons=None, workspace_dir=None,
                       **kwargs):
        """Export as TVM does for a freshly built llvm module (see tvm.runtime.Module.export_library)."""
        name = os.fspath(file_name)
        plain = not (fcompile or fpack_imports or addons or kwargs or len(self.imports))
        if plain and not name.endswith((".tar", ".wasm")) and self._cgc_library is not None:
            with open(name, "wb") as f:
                f.write(self._cgc_library)
            return None
        rebuilt = self._rebuilt()
        for imported in self.imports:
            rebuilt.import_module(imported)
        return rebuilt.export_library(name, fcompile=fcompile, fpack_imports=fpack_imports, addons=addons,
                                      workspace_dir=workspace_dir, **kwargs)

    def inspect_source(self, fmt=""):
        """The source in `fmt`, as the built llvm module gives it (LLVM IR: the stored text)."""
        if fmt == "ll":
            return self._ir_text()
        return self._rebuilt().inspect_source(fmt)

    def write_to_file(self, file_name, fmt=""):
        """Write the module as the built llvm module would (object file, assembly, IR)."""
        return self._rebuilt().write_to_file(file_name, fmt)

    def _ir_text(self) -> str:
        # Kept as the stored bytes, decoded when first asked for: most hits never need it.
        if not isinstance(self._cgc_ir, str):
            self._cgc_ir = str(self._cgc_ir, "utf-8")
        return self._cgc_ir

    def _rebuilt(self) -> Module:
        return load_ir(self._ir_text(), tempfile.gettempdir())


def load_library(library: bytes | memoryview, llvm_ir: str | bytes | memoryview, *, path: str | None, scratch: str,
                 loader: Callable[[str], Module] | None = None) -> CachedLibraryModule:
    """Map a stored shared library from a private copy of `library`, the bytes that were checked.

    `path`, the value file the bytes were read from, is never opened again (_private.py says
    why). `llvm_ir` may be its UTF-8 bytes (or a view of them): decoded when first asked for.
    """
    del path  # deliberately unused: loading by path would load what the file holds by then
    load = loader or _compat.builtin_func("ffi.Module.load_from_file.so")
    module = load_private_copy(library, scratch, lambda where: load(where, "so"))
    cached = CachedLibraryModule.__new__(CachedLibraryModule)
    cached.__move_handle_from__(module)
    cached._cgc_library = library
    cached._cgc_ir = llvm_ir
    return cached
