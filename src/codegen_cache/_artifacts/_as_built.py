"""The registry of the llvm modules the cache hands out, by handle, with what each answers from.

A hit runs from a dlopen-ed shared library (TVM's module kind `library`): the fast form. TVM
treats that kind as a different module: not compilation exportable, serializable to bytes only
in name (SaveToBytes fails), so `export_library` fails on it and on every tree that imports it
(a Relax executable built from a hit). A Python subclass cannot help there: TVM hands back the
modules of an import tree as plain `tvm.runtime.Module` objects.

So the module the cache hands out is of its own subclass, which answers as the built llvm
module does (`_module_methods`): `kind`, the property mask, `inspect_source`, `write_to_file`,
the functions only an llvm module has (`_get_target_string`, `__tvm_is_system_module`, ...) and
`export_library`, which exports a copy of the tree in which each registered library is the llvm
module parsed again from the stored IR (other nodes on the way are copied, never changed: another
thread may be using the caller's tree). Those modules are also kept in a process-wide registry,
by handle (`__chandle__()`): export finds them in a tree through it, and while the switch is on
the same methods on tvm.runtime.Module answer for every registered handle (every other module
gets TVM's own method after one dictionary lookup). Modules parsed from IR (CachedIRModule,
cross-target hits) are real llvm modules; they answer as built for what parsing loses: the
function names and the IR text.

The registry holds each module (so its handle is never another object's while registered), at
most MAX_MODULES of them and MAX_BYTES of their stored bytes: older ones drop out, least recently
handed out first, and then answer as what they are (`library`). A module the cache hands out
again (a memory hit) is registered again.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .. import _compat
from .._compat import Module
from .._forksafe import renew_after_fork
from . import _packed
from ._private import SCRATCH_PREFIX

__all__ = ["LLVM_QUERIES", "MAX_BYTES", "MAX_MODULES", "SCRATCH_PREFIX", "Record", "any_registered", "library_record",
           "parse_ir", "record_of", "register"]

logger = logging.getLogger(__name__)

MAX_MODULES = 1024
MAX_BYTES = 256 << 20
# Functions TVM's llvm module answers without compiling (export_library asks the first three).
LLVM_QUERIES = ("__tvm_is_system_module", "_get_target_string", "__tvm_get_system_lib_prefix", "get_func_names")
_FFI_PREFIX = "__tvm_ffi_"
_EXPORTABLE_LLVM = _compat.module_property_mask(runnable=True, exportable=True, serializable=False)


class Record:
    """What a registered module answers from: its stored IR, and (for a library) the library bytes.

    A plain class, not a dataclass: it is made when the switch is imported (docs/benchmarks.md at 5788f7c,
    "Records made at import").
    """

    __slots__ = ("ir", "library", "func_names", "queries", "mask")

    def __init__(self, ir: str | bytes | memoryview, library: bytes | memoryview | None,
                 func_names: Sequence[str] = (), queries: dict[str, Any] | None = None,
                 mask: int = _EXPORTABLE_LLVM) -> None:
        self.ir = ir  # bytes: the stored field, plain or packed (_packed)
        self.library = library  # None: the module is itself parsed from the IR
        self.func_names = func_names
        self.queries = {} if queries is None else queries  # LLVM_QUERIES as the built module answered
        self.mask = mask

    def ir_text(self) -> str:
        """The stored LLVM IR: the built module's `inspect_source("ll")`, byte for byte."""
        if isinstance(self.ir, str):
            return self.ir
        if _packed.is_packed(self.ir):
            # Unpacked on each ask (an export, inspect_source): what the record holds stays the
            # stored bytes, so that nbytes, which the registry's bound sums, never changes.
            return str(_packed.unpack(self.ir), "utf-8")
        self.ir = str(self.ir, "utf-8")  # kept as bytes until asked for: most hits never are
        return self.ir

    def rebuilt(self) -> Module:
        """A new llvm module parsed from the stored IR (compiles nothing until it is run)."""
        return parse_ir(self.ir_text(), tempfile.gettempdir())

    def query(self, name: str) -> Any:
        """What the built module's function `name` (one of LLVM_QUERIES) returned."""
        if name in self.queries and _answer_type_ok(name, self.queries[name]):
            return self.queries[name]
        if name == "get_func_names" and self.func_names:
            return [_FFI_PREFIX + n for n in self.func_names]
        return self.rebuilt().get_function(name)()  # an entry stored before these were recorded

    def implements(self, name: str) -> bool:
        """Whether the built module had function `name` (its `implements_function`)."""
        return _FFI_PREFIX + name in self.query("get_func_names") or name in self.func_names

    @property
    def nbytes(self) -> int:
        """The stored bytes the record keeps alive."""
        return len(self.ir) + (len(self.library) if self.library is not None else 0)


def _answer_type_ok(name: str, value: Any) -> bool:
    # A checksum is not authentication: a stored answer is used only if it has the built one's type.
    if name == "get_func_names":
        return isinstance(value, list) and all(isinstance(n, str) for n in value)
    if name == "__tvm_is_system_module":
        return isinstance(value, bool)
    return value is None or isinstance(value, str)


_lock = threading.Lock()
renew_after_fork(globals(), "_lock")
_registered: OrderedDict[int, tuple[Module, Record]] = OrderedDict()
_held_bytes = [0]


def register(module: Module, record: Record) -> None:
    """Have `module` (and every handle of it TVM gives out) answer as the built module."""
    handle = module.__chandle__()
    with _lock:
        found = _registered.get(handle)
        if found is not None and found[0] is module and found[1] is record:
            _registered.move_to_end(handle)  # handed out again (a memory hit): the newest, nothing else changes
            return
        old = _registered.pop(handle, None)
        if old is not None:
            _held_bytes[0] -= old[1].nbytes
        _registered[handle] = (module, record)
        _held_bytes[0] += record.nbytes
        while len(_registered) > 1 and (len(_registered) > MAX_MODULES or _held_bytes[0] > MAX_BYTES):
            _, (_, dropped) = _registered.popitem(last=False)
            _held_bytes[0] -= dropped.nbytes
            logger.debug("codegen cache: a cached llvm module left the registry (%d kept)", len(_registered))


def any_registered() -> bool:
    """Whether any module is registered (until one is, every method is TVM's own at once)."""
    return bool(_registered)


def record_of(module: Any) -> Record | None:
    """The record of a registered module handle, or None (one dictionary lookup)."""
    if not _registered:
        return None
    found = _registered.get(module.__chandle__())
    return found[1] if found is not None else None


def library_record(module: Any) -> Record | None:
    """The record of a registered *library* (a loaded shared library, not a module parsed from IR)."""
    found = record_of(module)
    return found if found is not None and found.library is not None else None


def parse_ir(llvm_ir: str, scratch: str) -> Module:
    """An llvm module parsed from IR text by TVM (its functions are JIT-compiled on first use)."""
    fd, path = tempfile.mkstemp(prefix=SCRATCH_PREFIX, suffix=".ll", dir=scratch)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(llvm_ir)
        return _compat.builtin_func("ffi.Module.load_from_file.ll")(path, "ll")
    finally:
        os.unlink(path)
