"""tvm.runtime.Module's methods, answering for the cache's registered llvm modules as the built one does.

Each replacement takes TVM's own method and calls it for every module the registry
(`_as_built`) does not hold; they are put on tvm.runtime.Module once, when the first llvm hit
is handed out (`answer_as_built`). See _as_built's docstring for why, and docs/cache.md.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile

from .. import _compat
from .._compat import Module
from .._errors import ExportError
from ._as_built import LLVM_QUERIES, SCRATCH_PREFIX, Record, any_registered, library_record, parse_ir, record_of, register

__all__ = ["answer_as_built", "substitute_tree"]

logger = logging.getLogger(__name__)

_methods = _compat.ModuleMethods()


def answer_as_built(module: Module, record: Record) -> None:
    """Have `module`, and every handle of it TVM gives out, answer as the built llvm module."""
    if not _methods.original and not _methods.missing:
        _install()
    register(module, record)


def _file_format(file_name: str, fmt: str) -> str:
    # TVM's GetFileFormat: the format given, else the file's extension.
    return fmt or os.path.splitext(str(file_name))[1].lstrip(".")


# ---- the methods: each takes TVM's own and answers for registered handles ---------------------


def _kind(original):
    if not isinstance(original, property):
        return original
    return property(lambda self: "llvm" if library_record(self) is not None else original.fget(self),
                    doc=original.__doc__)


def _get_property_mask(original):
    @functools.wraps(original)
    def get_property_mask(self):
        found = library_record(self)
        return found.mask if found is not None else original(self)
    return get_property_mask


def _property(bit: int):
    def make(original):
        @functools.wraps(original)
        def check(self):
            return bool(self.get_property_mask() & bit)
        return check
    return make


def _inspect_source(original):
    @functools.wraps(original)
    def inspect_source(self, fmt=""):
        found = record_of(self)
        if found is None:
            return original(self, fmt)
        if fmt in ("", "ll"):
            return found.ir_text()
        return found.rebuilt().inspect_source(fmt) if found.library is not None else original(self, fmt)
    return inspect_source


def _write_to_file(original):
    @functools.wraps(original)
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
    @functools.wraps(original)
    def get_function(self, name, query_imports=False):
        if name in LLVM_QUERIES and any_registered():
            found = record_of(self)
            if found is not None and (found.library is not None or name == "get_func_names"):
                value = found.query(name)
                return _compat.ffi_function(lambda: value)
        return original(self, name, query_imports)
    return get_function


def _implements_function(original):
    @functools.wraps(original)
    def implements_function(self, name, query_imports=False):
        found = record_of(self)
        # A loaded library knows its own symbols: it answers (a stored function list is metadata, and
        # metadata is not the code). A module parsed from IR knows them only once compiled: the record.
        if found is not None and found.library is None and found.implements(name):
            return True
        return original(self, name, query_imports)
    return implements_function


def _export_library(original):
    @functools.wraps(original)
    def export_library(self, file_name, *, fcompile=None, fpack_imports=None, addons=None, workspace_dir=None,
                       **kwargs):
        if not any_registered():
            return original(self, file_name, fcompile=fcompile, fpack_imports=fpack_imports, addons=addons,
                            workspace_dir=workspace_dir, **kwargs)
        name = os.fspath(file_name)
        found = library_record(self)
        plain = not (fcompile or fpack_imports or addons or workspace_dir or kwargs)
        if found is not None and plain and not name.endswith((".tar", ".wasm")) and not len(self.imports):
            # What TVM writes here is this library: the stored object file linked with -shared.
            with open(name, "wb") as f:
                f.write(found.library)
            return None
        tree = substitute_tree(self)
        return original(self if tree is None else tree, name, fcompile=fcompile, fpack_imports=fpack_imports,
                        addons=addons, workspace_dir=workspace_dir, **kwargs)
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
        found = library_record(node)
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
