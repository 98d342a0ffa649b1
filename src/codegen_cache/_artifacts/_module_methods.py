"""How the cache's llvm hits answer as the built llvm module, changing nothing of TVM unless switched on.

A hit runs from a loaded shared library, which TVM reports and exports as another kind of
module (_as_built's docstring says how). Two places answer for it instead, with the same methods:

- The module the cache hands out is of its own subclass (`AnswersAsBuilt`), whose methods answer
  from the record the object carries. A cache used without the switch (`CodegenCache.lower`,
  `DeviceCodegen.lower`) therefore returns a module that exports, reports and prints as TVM's
  own result, and no class, global or function of TVM is touched.
- TVM hands the modules of an import tree back as plain tvm.runtime.Module objects (a Relax
  executable's `imports`, the nodes export_library walks); no subclass reaches those. They answer
  as built only while the switch is on: `enable()` puts the methods, answering from the registry
  by handle, on tvm.runtime.Module (`install_on_module`) and `disable()` puts TVM's own
  attributes back (`uninstall_from_module`). A tree the switch hands out (tvm.tirx.build's
  module, a Relax executable's module) gets a root of the subclass (`as_built_root`), so it
  exports after `disable()` too; only its plain sub-modules then answer as what they are
  (`library`). A tree a user puts together around a hit without the switch (`import_module`)
  exports through a root the cache handed out, not through a plain parent.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

from .. import _compat
from .._compat import Module
from .._errors import ExportError
from ._as_built import LLVM_QUERIES, SCRATCH_PREFIX, Record, any_registered, parse_ir, record_of, register

__all__ = ["AnswersAsBuilt", "answer_as_built", "as_built_root", "install_on_module", "installed_on_module",
           "own_root", "substitute_tree", "uninstall_from_module"]

logger = logging.getLogger(__name__)

Finder = Callable[[Any], "Record | None"]

_methods = _compat.ModuleMethods()
# TVM's own attributes, read before anything could replace them: the subclass's methods wrap these.
_ORIGINAL = _methods.originals()


def answer_as_built(module: AnswersAsBuilt, record: Record) -> None:
    """`module` answers as the built llvm module; its handles in trees do too while the switch is on."""
    module._cgc_record = record
    register(module, record)


def _file_format(file_name: str, fmt: str) -> str:
    # TVM's GetFileFormat: the format given, else the file's extension.
    return fmt or os.path.splitext(str(file_name))[1].lstrip(".")


def _library(found: Record | None) -> Record | None:
    return found if found is not None and found.library is not None else None


# ---- the methods: each takes TVM's own and a way to find a module's record ----------------------


def _kind(original, find: Finder):
    if not isinstance(original, property):
        return original
    return property(lambda self: "llvm" if _library(find(self)) is not None else original.fget(self),
                    doc=original.__doc__)


def _get_property_mask(original, find: Finder):
    @functools.wraps(original)
    def get_property_mask(self):
        found = _library(find(self))
        return found.mask if found is not None else original(self)
    return get_property_mask


def _property(bit: int):
    def make(original, find: Finder):
        @functools.wraps(original)
        def check(self):
            return bool(self.get_property_mask() & bit)
        return check
    return make


def _inspect_source(original, find: Finder):
    @functools.wraps(original)
    def inspect_source(self, fmt=""):
        found = find(self)
        if found is None:
            return original(self, fmt)
        if fmt in ("", "ll"):
            return found.ir_text()
        return found.rebuilt().inspect_source(fmt) if found.library is not None else original(self, fmt)
    return inspect_source


def _write_to_file(original, find: Finder):
    @functools.wraps(original)
    def write_to_file(self, file_name, fmt=""):
        found = find(self)
        if found is None:
            return original(self, file_name, fmt)
        if _file_format(file_name, fmt) == "ll":
            with open(file_name, "w") as f:  # printing a parsed module renames it: the text as built
                f.write(found.ir_text())
            return None
        return found.rebuilt().write_to_file(file_name, fmt) if found.library is not None \
            else original(self, file_name, fmt)
    return write_to_file


def _get_function(original, find: Finder):
    @functools.wraps(original)
    def get_function(self, name, query_imports=False):
        if name in LLVM_QUERIES:
            found = find(self)
            if found is not None and (found.library is not None or name == "get_func_names"):
                value = found.query(name)
                return _compat.ffi_function(lambda: value)
        return original(self, name, query_imports)
    return get_function


def _implements_function(original, find: Finder):
    @functools.wraps(original)
    def implements_function(self, name, query_imports=False):
        found = find(self)
        # A loaded library knows its own symbols: it answers (a stored function list is metadata, and
        # metadata is not the code). A module parsed from IR knows them only once compiled: the record.
        if found is not None and found.library is None and found.implements(name):
            return True
        return original(self, name, query_imports)
    return implements_function


def _export_library(original, find: Finder):
    @functools.wraps(original)
    def export_library(self, file_name, *, fcompile=None, fpack_imports=None, addons=None, workspace_dir=None,
                       **kwargs):
        found = _library(find(self))
        name = os.fspath(file_name)
        plain = not (fcompile or fpack_imports or addons or workspace_dir or kwargs)
        if found is not None and plain and not name.endswith((".tar", ".wasm")) and not len(self.imports):
            # What TVM writes here is this library: the stored object file linked with -shared.
            with open(name, "wb") as f:
                f.write(found.library)
            return None
        tree = substitute_tree(self, found) if found is not None or any_registered() else None
        return original(self if tree is None else tree, name, fcompile=fcompile, fpack_imports=fpack_imports,
                        addons=addons, workspace_dir=workspace_dir, **kwargs)
    return export_library


_FACTORIES = {
    "kind": _kind, "get_property_mask": _get_property_mask,
    "is_binary_serializable": _property(_compat.module_property_mask(runnable=False, exportable=False,
                                                                     serializable=True)),
    "is_runnable": _property(_compat.module_property_mask(runnable=True, exportable=False, serializable=False)),
    "is_compilation_exportable": _property(_compat.module_property_mask(runnable=False, exportable=True,
                                                                        serializable=False)),
    "inspect_source": _inspect_source, "write_to_file": _write_to_file, "get_function": _get_function,
    "implements_function": _implements_function, "export_library": _export_library,
}


def _own_record(module: Any) -> Record | None:
    # The record the object carries (a module the cache handed out), else the registry's (a tree's root).
    found = getattr(module, "_cgc_record", None)
    return found if found is not None else record_of(module)


class AnswersAsBuilt(Module):
    """A module the cache hands out: it answers `kind`, properties, sources and export as the built llvm module."""

    _cgc_record: Record | None = None


for _name, _original in _ORIGINAL.items():
    setattr(AnswersAsBuilt, _name, _FACTORIES[_name](_original, _own_record))


def as_built_root(result: Any) -> Any:
    """`result` (a Module, or an Executable holding one) with a root that exports its registered libraries.

    A tree that TVM put together around a cached library (tvm.tirx.build's host module, a Relax
    executable) reaches the caller as a plain Module: given a root of AnswersAsBuilt (a new handle
    object for the same module), it exports the library as the built module, switch or not.
    """
    if not any_registered():
        return result
    mod = getattr(result, "mod", None) if not isinstance(result, Module) else result
    if not isinstance(mod, Module) or isinstance(mod, AnswersAsBuilt) or not _holds_library(mod):
        return result
    root = own_root(_same_module(mod))  # the caller's object keeps its own handle
    if result is mod:
        return root
    result.mod = root
    return result


def own_root(module: Module) -> AnswersAsBuilt:
    """A root of AnswersAsBuilt taking over `module`'s handle (`module` is left empty).

    For a tree whose maker holds a registered library in it and owns `module` (the cache's own
    Relax executable on a model hit): as_built_root's result, without walking the tree.
    """
    root = AnswersAsBuilt.__new__(AnswersAsBuilt)
    root.__move_handle_from__(module)
    return root


def _holds_library(root: Module) -> bool:
    """Whether a registered library is anywhere in `root`'s import tree."""
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        handle = node.__chandle__()
        if handle in seen:
            continue
        seen.add(handle)
        if _library(record_of(node)) is not None:
            return True
        stack.extend(node.imports)
    return False


@functools.lru_cache(maxsize=1)
def _identity() -> Any:
    return _compat.ffi_function(lambda module: module)


def _same_module(module: Module) -> Module:
    """Another Python object for the same TVM module (TVM wraps what a function returns anew)."""
    return _identity()(module)


# ---- the switch's part: the same methods on tvm.runtime.Module, answering by handle ---------------


def install_on_module() -> None:
    """Have every handle of a registered module answer as built: the methods on tvm.runtime.Module."""
    _methods.install({name: functools.partial(factory, find=record_of) for name, factory in _FACTORIES.items()})
    if _methods.missing:
        logger.debug("codegen cache: this TVM's Module has no %s; cached llvm hits answer there as loaded "
                     "libraries", ", ".join(_methods.missing))


def uninstall_from_module() -> None:
    """Put TVM's own attributes of tvm.runtime.Module back, exactly as they were."""
    _methods.uninstall()


def installed_on_module() -> bool:
    """Whether tvm.runtime.Module carries the cache's methods now."""
    return _methods.installed


# ---- export: the tree with each registered library as the llvm module it was built as ----------


def substitute_tree(root: Module, root_record: Record | None = None) -> Module | None:
    """A copy of `root`'s import tree with every registered library parsed again from its IR.

    `root_record`: the root's own record where it carries one. None when no registered library
    is in the tree. Nodes with no registered library below them are shared, not copied
    (importing a module into a new parent does not change it).
    """
    done: dict[int, Module | None] = {}
    on_path: set[int] = set()
    root_handle = root.__chandle__()

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
        found = root_record if handle == root_handle and root_record is not None else _library(record_of(node))
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
