"""Linking stored LLVM IR into a shared library, without importing TVM: the llvm upgrader's work.

The upgrader (_cache/_upgrade.py) runs in a helper process that never imports TVM's Python
package: TVM's LLVM emits the object file through tvm-ffi's Python API (_compat/_emit.py), and the
compiler `export_library` would use links it (`$CXX`/`$CC` or g++, `-shared -fPIC`). LLVM IR
for another platform than this host's stays IR (no compiler here can link it): the host's
triple comes from the process that started the upgrader.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile

from .._compat._emit import emit_object
from ._frame import check, frame, unframe
from ._packed import SMALL_LEVEL, pack, unpack
from ._private import SCRATCH_PREFIX

__all__ = ["arch_and_os", "compiler_command", "ir_triple", "same_platform", "shared_library_from_ir", "upgrade"]

_COMPILERS = ("g++", "gcc", "clang++", "clang", "c++", "cc")  # tvm.support.cc.get_cc's order
_TRIPLE = re.compile(r'^target triple = "([^"]*)"', re.MULTILINE)
_TRIPLE_BYTES = re.compile(rb'^target triple = "([^"]*)"', re.MULTILINE)
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "i386": "x86", "i686": "x86"}
_OSES = ("linux", "darwin", "macos", "ios", "windows", "freebsd", "netbsd", "openbsd", "android", "wasi",
         "emscripten", "none")


def ir_triple(llvm_ir: str | bytes) -> str:
    """The `target triple` LLVM IR text declares ('' when it declares none)."""
    if isinstance(llvm_ir, bytes):
        found = _TRIPLE_BYTES.search(llvm_ir, 0, 1 << 16)
        return found.group(1).decode("utf-8", "replace") if found else ""
    found = _TRIPLE.search(llvm_ir, 0, 1 << 16)  # near the top, after the data layout
    return found.group(1) if found else ""


def arch_and_os(triple: str) -> tuple[str, str]:
    parts = triple.lower().split("-")
    arch = _ARCH_ALIASES.get(parts[0], parts[0])
    system = next((p for p in parts[1:] for o in _OSES if p.startswith(o)), "")
    return arch, next((o for o in _OSES if system.startswith(o)), system)


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


def shared_library_from_ir(llvm_ir: bytes | memoryview, scratch: str, libraries: list[str], *,
                           compiler: list[str] | None = None, timeout: float = 600.0) -> bytes:
    """Emit an object file from LLVM IR and link it into a shared library (helper process only).

    `libraries`: the TVM shared libraries whose LLVM emits the object (_compat/_emit.py).
    """
    command = compiler_command() if compiler is None else compiler
    if not command or shutil.which(command[0]) is None:
        raise OSError(f"no C compiler to link a shared library (tried $CXX, $CC, {', '.join(_COMPILERS)}; "
                      f"got {' '.join(command) or 'nothing'})")
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=scratch) as tmp:
        ir, obj, lib = (os.path.join(tmp, name) for name in ("lib.ll", "lib.o", "lib.so"))
        with open(ir, "wb") as f:
            f.write(llvm_ir)
        emit_object(libraries, ir, obj)
        # Its own session: Ctrl-C in a terminal or a Jupyter interrupt (SIGINT to the process
        # group) must not kill the linker halfway.
        done = subprocess.run([*command, "-shared", "-fPIC", "-o", lib, obj], capture_output=True, text=True,
                              timeout=timeout, start_new_session=True, check=False)
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} -shared failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        with open(lib, "rb") as f:
            return f.read()


def same_platform(triple: str, host: str) -> bool:
    """Whether code for LLVM `triple` runs on a host whose triple is `host` ('' : unknown, counts as the same).

    Only the CPU architecture and the OS count; a vendor (`pc`, `unknown`, `conda`) or
    environment (`gnu`) part does not.
    """
    return not host or not triple or arch_and_os(triple) == arch_and_os(host)


def upgrade(blob: bytes, scratch: str, *, libraries: list[str], host_triple: str) -> bytes | None:
    """The fast form of an entry (llvm-ir -> llvm-so), or None when it has none here."""
    art = unframe(blob)
    check(art)
    if art.codec != "llvm-ir":
        return None
    ir = unpack(art.fields[0])
    if not same_platform(art.meta.get("triple") or ir_triple(bytes(ir[:1 << 16])), host_triple):
        return None  # another target's code
    # The IR packed again, smaller: this process spends far longer emitting and linking (_packed.py).
    return frame("llvm-so", art.meta, [shared_library_from_ir(ir, scratch, libraries), pack(ir, SMALL_LEVEL)])
