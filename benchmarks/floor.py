"""The independent floor of a hit: what the machine must do, none of it the cache's own code.

    floor = TVM's structural hash of the IRModule
          + reading the entry's stored bytes (sqlite3 SELECT of the diskcache row, then
            os.pread of its value file where it has one)
          + the load a module of that kind needs from a file that already exists:
            TVM's load_module of a shared library (llvm; keep_module_alive=False, see below), ffi.Module.load_from_bytes.cuda
            of the CUDA payload (nvcc), runtime.CSourceModuleCreate / SourceModuleCreate of
            the source text (c, CUDA source)

What is prepared once, untimed: the shared library is written to its own file, and the
offsets of the payload inside the stored bytes are noted (any format must find its payload;
the slice and the text decode are timed). Where the stored form is LLVM IR (no shared library
yet), the floor loads the IR file with load_module, as TVM would.

`tvm.runtime.load_module` keeps every library it loads mapped for the life of the process
(tvm_ffi's keep_module_alive=True), so from its second call on, loading the same file is a
lookup of a library already loaded (2 us), not a load (40 us for the vector add). A hit in a
fresh process maps the library; so does a disk hit whose module nobody keeps. The floor
therefore calls tvm_ffi.load_module(path, keep_module_alive=False): the same loader, with the
library unmapped again when its module goes.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi

__all__ = ["RawStore", "floor_loader", "tvm_hash"]

_SELECT = "SELECT filename, value FROM Cache WHERE key = ? AND raw = 1"


def tvm_hash(mod) -> int:
    """TVM's structural hash of the whole module (map_free_vars, as a CPU module needs)."""
    return tvm_ffi.structural_hash(mod, map_free_vars=True)


class RawStore:
    """A diskcache store's bytes by key, read with sqlite3 and os.pread only."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = str(directory)
        self.db = sqlite3.connect(os.path.join(self.directory, "cache.db"), check_same_thread=False,
                                  isolation_level=None)

    def read(self, key: str) -> bytes:
        """The stored bytes under `key` (KeyError when absent)."""
        row = self.db.execute(_SELECT, (key,)).fetchone()
        if row is None:
            raise KeyError(key)
        filename, value = row
        if not filename:
            return bytes(value)
        fd = os.open(os.path.join(self.directory, filename), os.O_RDONLY)
        try:
            return os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the connection."""
        self.db.close()


def floor_loader(blob: bytes, scratch: str | os.PathLike[str]) -> tuple[str, Callable[[bytes], Any]]:
    """(codec, load(stored bytes) -> module) for one stored entry; prepared from `blob` once."""
    from codegen_cache._artifacts import unframe  # setup only: where the payload lies

    art = unframe(blob, info=False)
    spans, pos = [], 0
    for field in art.fields:
        spans.append((pos, pos + len(field)))
        pos += len(field)
    codec = art.codec
    if codec in ("llvm-so", "llvm-ir"):
        path = Path(scratch) / f"floor-{os.getpid()}-{id(blob):x}.{'so' if codec == 'llvm-so' else 'll'}"
        path.write_bytes(art.fields[0])
        text = str(path)
        return codec, lambda data: tvm_ffi.load_module(text, keep_module_alive=False)
    if codec == "c":
        create = tvm.get_global_func("runtime.CSourceModuleCreate")
        names = [str(n) for n in art.meta.get("c_func_names", [])]
        (a, b), = spans
        return codec, lambda data: create(data[a:b].decode(), "c", names, [])
    if codec == "source":
        create = tvm.get_global_func("runtime.SourceModuleCreate")
        fmt = str(art.meta.get("source_format", ""))
        (a, b), = spans
        return codec, lambda data: create(data[a:b].decode(), fmt)
    if codec == "cuda-fallback":
        # TVM's source-only CUDA module has no constructor outside target.build.cuda: the floor
        # is the plain source module of the same text (what the hit itself makes it from).
        create = tvm.get_global_func("runtime.SourceModuleCreate")
        _fmap, (a, b) = spans
        return codec, lambda data: create(data[a:b].decode(), "cu")
    if codec == "cuda-bin":
        from codegen_cache._artifacts import CudaPayload

        # TVM's own byte format of a CUDA module: what load_from_bytes.cuda reads.
        payload = CudaPayload(art.fields[0].decode(), art.fields[1], art.fields[2]).to_bytes()
        load = tvm.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True)
        if load is None:
            return codec, lambda data: None
        return codec, lambda data: load(payload)
    raise ValueError(f"no floor for codec {codec!r}")
