"""The cache's llvm hits answer as the llvm module TVM built, wherever they are reached from.

A hit runs from a dlopen-ed shared library (TVM's module kind `library`): the fast form. TVM
treats that kind as a different module: not compilation exportable, serializable to bytes only
in name (SaveToBytes fails), so `export_library` fails on it and on every tree that imports it
(a Relax executable built from a hit). A Python subclass cannot help there: TVM hands back the
modules of an import tree as plain `tvm.runtime.Module` objects.

So the library modules the cache hands out are kept in a process-wide registry, by handle
(`__chandle__()`), and a few methods of tvm.runtime.Module answer for a registered handle as the
built llvm module does: `kind`, the property mask, `inspect_source`, `write_to_file`, the
functions only an llvm module has (`_get_target_string`, `__tvm_is_system_module`, ...) and
`export_library`, which exports a copy of the tree in which each registered library is the llvm
module parsed again from the stored IR (other nodes on the way are copied, never changed: another
thread may be using the caller's tree). Every other module gets TVM's own method after one
dictionary lookup. Modules parsed from IR (CachedIRModule, cross-target hits) are real llvm
modules; they are registered for what parsing loses: the function names and the IR text.

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
from dataclasses import dataclass, field
from typing import Any

from .. import _compat
from .._compat import Module
from .._errors import ExportError

__all__ = ["LLVM_QUERIES", "MAX_BYTES", "MAX_MODULES", "SCRATCH_PREFIX", "Record", "parse_ir", "record_of", "register",
           "substitute_tree"]

logger = logging.getLogger(__name__)

# Every scratch file and directory the cache makes starts with this: the sweep of leftovers
# removes only names with it, so files the cache did not create are never touched.
SCRATCH_PREFIX = "cgc-"
MAX_MODULES = 1024
MAX_BYTES = 256 << 20
# Functions TVM's llvm module answers without compiling (export_library asks the first three).
LLVM_QUERIES = ("__tvm_is_system_module", "_get_target_string", "__tvm_get_system_lib_prefix", "get_func_names")
_FFI_PREFIX = "__tvm_ffi_"
_EXPORTABLE_LLVM = _compat.module_property_mask(runnable=True, exportable=True, serializable=False)


@dataclass(slots=True)
class Record:
    """What a registered module answers from: its stored IR, and (for a library) the library bytes."""

    ir: str | bytes | memoryview
    library: bytes | memoryview | None  # None: the module is itself parsed from the IR
    func_names: Sequence[str] = ()
    queries: dict[str, Any] = field(default_factory=dict)  # LLVM_QUERIES as the built module answered
    mask: int = _EXPORTABLE_LLVM

    def ir_text(self) -> str:
        """The stored LLVM IR: the built module's `inspect_source("ll")`, byte for byte."""
        if not isinstance(self.ir, str):
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
_registered: OrderedDict[int, tuple[Module, Record]] = OrderedDict()
_held_bytes = [0]
_methods = _compat.ModuleMethods()


def register(module: Module, record: Record) -> None:
    """Have `module` (and every handle of it TVM gives out) answer as the built module."""
    if not _methods.original and not _methods.missing:
        _install()
    handle = module.__chandle__()
    with _lock:
        old = _registered.pop(handle, None)
        if old is not None:
            _held_bytes[0] -= old[1].nbytes
        _registered[handle] = (module, record)
        _held_bytes[0] += record.nbytes
        while len(_registered) > 1 and (len(_registered) > MAX_MODULES or _held_bytes[0] > MAX_BYTES):
            _, (_, dropped) = _registered.popitem(last=False)
            _held_bytes[0] -= dropped.nbytes
            logger.debug("codegen cache: a cached llvm module left the registry (%d kept)", len(_registered))


def record_of(module: Any) -> Record | None:
    """The record of a registered module handle, or None."""
    if not _registered:
        return None
    found = _registered.get(module.__chandle__())
    return found[1] if found is not None else None


def _library(module: Any) -> Record | None:
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


def _file_format(file_name: str, fmt: str) -> str:
    # TVM's GetFileFormat: the format given, else the file's extension.
    return fmt or os.path.splitext(str(file_name))[1].lstrip(".")


# ---- the methods: each takes TVM's own and answers for registered handles ---------------------


def _kind(original):
    if not isinstance(original, property):
        return original
    return property(lambda self: "llvm" if _library(self) is not None else original.fget(self),
                    doc=original.__doc__)


def _get_property_mask(original):
    def get_property_mask(self):
        found = _library(self)
        return found.mask if found is not None else original(self)
    return get_property_mask


def _property(bit: int):
    def make(original):
        def check(self):
            return bool(self.get_property_mask() & bit)
        check.__doc__ = original.__doc__
        return check
    return make


def _inspect_source(original):
    def inspect_source(self, fmt=""):
        found = record_of(self)
        if found is None:
            return original(self, fmt)
        if fmt in ("", "ll"):
            return found.ir_text()
        return found.rebuilt().inspect_source(fmt) if found.library is not None else original(self, fmt)
    return inspect_source


def _write_to_file(original):
    def write_to_file(self, file_name, fmt=""):
        found = record_of(self)
        if found is None:
            return original(self, file_name, fmt)
        if _file_format(file_name, fmt) == "ll":
            with open(file_name, "w") as f:  # printing a parsed module renames it: the text as built
                f.write(found.ir_text())
            return None
        return found.rebuilt().write_to_file(file_name, fmt) if found.library is not None \
            else original(self, file_name, fmt)
    return write_to_file


def _get_function(original):
    def get_function(self, name, query_imports=False):
        if name in LLVM_QUERIES and _registered:
            found = record_of(self)
            if found is not None and (found.library is not None or name == "get_func_names"):
                value = found.query(name)
                return _compat.ffi_function(lambda: value)
        return original(self, name, query_imports)
    return get_function


def _implements_function(original):
    def implements_function(self, name, query_imports=False):
        found = record_of(self)
        if found is not None and found.implements(name):
            return True
        return original(self, name, query_imports)
    return implements_function


def _export_library(original):
    def export_library(self, file_name, *, fcompile=None, fpack_imports=None, addons=None, workspace_dir=None,
                       **kwargs):
        if not _registered:
            return original(self, file_name, fcompile=fcompile, fpack_imports=fpack_imports, addons=addons,
                            workspace_dir=workspace_dir, **kwargs)
        name = os.fspath(file_name)
        found = _library(self)
        plain = not (fcompile or fpack_imports or addons or workspace_dir or kwargs)
        if found is not None and plain and not name.endswith((".tar", ".wasm")) and not len(self.imports):
            # What TVM writes here is this library: the stored object file linked with -shared.
            with open(name, "wb") as f:
                f.write(found.library)
            return None
        tree = substitute_tree(self)
        return original(self if tree is None else tree, name, fcompile=fcompile, fpack_imports=fpack_imports,
                        addons=addons, workspace_dir=workspace_dir, **kwargs)
    export_library.__doc__ = original.__doc__
    return export_library


def _install() -> None:
    _methods.install({
        "kind": _kind, "get_property_mask": _get_property_mask,
        "is_binary_serializable": _property(_compat.module_property_mask(runnable=False, exportable=False,
                                                                         serializable=True)),
        "is_runnable": _property(_compat.module_property_mask(runnable=True, exportable=False, serializable=False)),
        "is_compilation_exportable": _property(_compat.module_property_mask(runnable=False, exportable=True,
                                                                            serializable=False)),
        "inspect_source": _inspect_source, "write_to_file": _write_to_file, "get_function": _get_function,
        "implements_function": _implements_function, "export_library": _export_library,
    })
    if _methods.missing:
        logger.debug("codegen cache: this TVM's Module has no %s; cached llvm hits answer there as loaded "
                     "libraries", ", ".join(_methods.missing))


# ---- export: the tree with each registered library as the llvm module it was built as ----------


def substitute_tree(root: Module) -> Module | None:
    """A copy of `root`'s import tree with every registered library parsed again from its IR.

    None when no registered library is in the tree. Nodes with no registered library below them
    are shared, not copied (importing a module into a new parent does not change it).
    """
    done: dict[int, Module | None] = {}
    on_path: set[int] = set()

    def visit(node: Module) -> Module | None:
        handle = node.__chandle__()
        if handle in done:
            return done[handle]
        if handle in on_path:
            return None  # a cycle: TVM's own export rejects it
        on_path.add(handle)
        children = list(node.imports)
        copies = [visit(child) for child in children]
        on_path.discard(handle)
        found = _library(node)
        if found is None and all(c is None for c in copies):
            done[handle] = None
            return None
        copy = found.rebuilt() if found is not None else _copy_alone(node)
        for child, child_copy in zip(children, copies):
            copy.import_module(child if child_copy is None else child_copy)
        done[handle] = copy
        return copy

    return visit(root)


def _copy_alone(node: Module) -> Module:
    """A copy of `node` without its imports (it imports a registered library, which is replaced)."""
    kind = node.kind
    if kind == "llvm":
        return parse_ir(node.inspect_source("ll"), tempfile.gettempdir())
    load = _compat.global_func(f"ffi.Module.load_from_file.{kind}", missing_ok=True)
    if load is None or not node.is_binary_serializable():
        raise ExportError(kind)
    fd, path = tempfile.mkstemp(prefix=SCRATCH_PREFIX, suffix=".bin")
    os.close(fd)
    try:
        node.write_to_file(path)
        return load(path)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ExportError(kind, str(err)) from err
    finally:
        os.unlink(path)
