"""LLVM modules as stored artifacts: LLVM IR text (the raw form) and a shared library (the fast form).

TVM's LLVM module cannot be saved to bytes. A built module is stored at once as its LLVM IR
text, in memory (`ir_text`: LLVM prints it into a memfd, else `inspect_source("ll")`), which
TVM loads back by re-parsing it. A helper process later turns the IR into a shared library
(_link.py), which a hit maps with dlopen (no compile). LLVM aborts the whole process on an I/O
error while it emits an object file, so that step never runs in the user's process.
"""

from __future__ import annotations

import functools
import os
import resource
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import _compat
from .._compat import Module
from ._as_built import LLVM_QUERIES, SCRATCH_PREFIX, Record, parse_ir
from ._link import ir_triple, same_platform
from ._module_methods import AnswersAsBuilt, answer_as_built
from ._private import fd_path, load_private_copy

__all__ = [
    "SCRATCH_PREFIX",
    "CachedIRModule",
    "CachedLibraryModule",
    "LLVM_QUERIES",
    "ir_text",
    "ir_triple",
    "keep_answering",
    "load_ir",
    "load_library",
    "runs_here",
]


_memfd_create = getattr(os, "memfd_create", None)


def ir_text(module: Module) -> bytes:
    """A built llvm module's LLVM IR text, byte for byte what `inspect_source("ll")` returns.

    LLVM prints it into a memfd (anonymous memory, no file system), read back once as bytes:
    `inspect_source` turns the text into a str that a store encodes back (what the memfd saves is
    in the commit that removed benchmarks/bench_ir_text.py). LLVM ends the process on a failed write, so the memfd is used
    only where a write can fail no other way than the process's memory running out: not under a
    file size limit (RLIMIT_FSIZE, which applies to memfds too). Elsewhere, and where no memfd
    can be made, `inspect_source`.
    """
    fd = _ir_memfd()
    if fd is not None:
        try:
            module.write_to_file(fd_path(fd), "ll")
            data = _read_whole(fd)
            if data:
                return data
        except (OSError, RuntimeError, ValueError, AttributeError):  # AttributeError: a TVM without write_to_file
            pass
        finally:
            os.close(fd)
    return module.inspect_source("ll").encode()


def _ir_memfd() -> int | None:
    if _memfd_create is None or resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        return None
    try:
        return _memfd_create("codegen-cache-ir", os.MFD_CLOEXEC)
    except OSError:
        return None


def _read_whole(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks, done = [], 0
    while done < size:  # one pread but for texts over the 2 GiB a read returns at most
        chunk = os.pread(fd, size - done, done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def runs_here(triple: object) -> bool:
    """Whether code for LLVM `triple` runs on this host: the same CPU architecture and OS.

    Unknown (None, '': an entry stored before triples were recorded) counts as this host's, as
    before; a vendor (`pc`, `unknown`, `conda`) or environment (`gnu`) part does not matter.
    """
    return not isinstance(triple, str) or not triple or _runs_here(triple)


@functools.lru_cache(maxsize=64)
def _runs_here(triple: str) -> bool:
    return same_platform(triple, _compat.host_llvm_triple())


class CachedIRModule(AnswersAsBuilt):
    """An llvm module parsed from cached LLVM IR: it runs (JIT-compiled on first use) and exports.

    TVM's module from IR text does not know its functions' names until it compiles them, and
    prints the IR it parsed with another module name: it answers `implements_function`,
    `get_func_names` and `inspect_source("ll")` as built (_module_methods).
    """


def load_ir(llvm_ir: str, scratch: str, func_names: Sequence[str] = (),
            queries: Mapping[str, Any] | None = None) -> CachedIRModule:
    """An llvm module from cached IR text (TVM parses it again), answering as the built one."""
    cached = CachedIRModule.__new__(CachedIRModule)
    cached.__move_handle_from__(parse_ir(llvm_ir, scratch))
    answer_as_built(cached, Record(llvm_ir, None, tuple(func_names), dict(queries or {})))
    return cached


class CachedLibraryModule(AnswersAsBuilt):
    """A module mapped from a cached shared library: runs like the built llvm module, and exports.

    It reports kind `llvm` and the built module's properties, and exports as the built module
    does (from its stored IR; alone with default options, the stored library); so does every
    handle of it inside another module's import tree while the switch is on (_module_methods).
    """


def load_library(library: bytes | memoryview, llvm_ir: str | bytes | memoryview, *, path: str | None, scratch: str,
                 loader: Callable[[str], Module] | None = None, func_names: Sequence[str] = (),
                 queries: Mapping[str, Any] | None = None, mask: int | None = None) -> CachedLibraryModule:
    """Map a stored shared library from a private copy of `library`, the bytes that were checked.

    `path`, the value file the bytes were read from, is never opened again (_private.py says
    why). `llvm_ir` may be its UTF-8 bytes (or a view of them): decoded when first asked for.
    """
    del path  # deliberately unused: loading by path would load what the file holds by then
    load = loader or _compat.builtin_func("ffi.Module.load_from_file.so")
    module = load_private_copy(library, scratch, lambda where: load(where, "so"))
    cached = CachedLibraryModule.__new__(CachedLibraryModule)
    cached.__move_handle_from__(module)
    record = Record(llvm_ir, library, tuple(func_names), dict(queries or {}))
    if mask is not None:
        record.mask = mask
    answer_as_built(cached, record)
    return cached


def keep_answering(module: Any) -> None:
    """A cached llvm module handed out again (a memory hit): registered again, as the newest."""
    if isinstance(module, AnswersAsBuilt) and module._cgc_record is not None:
        answer_as_built(module, module._cgc_record)
