"""TVM's registered state that a compile reads, as fingerprints that compare across processes.

Three kinds of place, each read the same way in the asking process and in the helper process
that takes the clean baseline (_baseline.py), so that equal state gives equal fingerprints:

    slots    global:<name>         a global function backed by Python (C++ code is not seen)
             op:<op>:<attr>        an operator attribute a pipeline reads (ATTRS, and the TIR
                                   lowering rules of each target kind)
             pipeline:<kind>:<n>   a pipeline registered by name (Relax's and TIR's PIPELINE_MAP)
    modules  <tvm module>          a digest of the module's callable attributes (a function
                                   replaced by assignment, `relax.transform.LegalizeOps = f`)

A fingerprint is _identity.fingerprint: TVM's own code by where it is defined and what it holds,
anyone else's by its code. What this package installs into TVM (the switch's routers) counts as
what it replaced (`own()`), so enabling the switch does not change a key.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

import xxhash

from .. import _compat
from .._compat import tvm_ffi
from .._errors import UncacheableError
from ..codegens._pyfunc import python_callable
from ._identity import code_owner, fingerprint

__all__ = ["DEFAULT_KINDS", "RELAX_ATTRS", "TIR_ATTRS", "lowering_attrs", "module_digest", "own", "read_attrs", "read_globals",
           "read_modules", "read_pipelines", "read_slots", "slot_fingerprint", "slot_fingerprint_or_reason",
           "tvm_modules"]

# Operator attributes TVM's passes read (the attribute names in its compiler library). Of Relax
# operators (`relax.*`): functions (legalization, gradients, layout and mixed-precision rules,
# struct info) and plain values (fusion patterns, purity, packed-call names).
RELAX_ATTRS = ("FLegalize", "FPrimalGradient", "FInferMixedPrecision", "FLowerBuiltin", "FNormalize",
               "FRelaxInferLayout", "FValidate", "FInferStructInfo", "FCallPacked", "FPurity", "FDataDependent",
               "TOpPattern", "TMixedPrecisionPolicy")
# Of the other (TIR) operators, besides the lowering rules of each target kind.
TIR_ATTRS = ("TCallEffectKind", "TGlobalSymbol", "TVectorizable", "TOpPattern")
RELAX_OPS = "relax."
# Lowering rules read by a compile for any target kind.
DEFAULT_KINDS = ("default", "fastmath")

# id(what this package installed) -> (it, what it replaced): the replaced one is fingerprinted.
_own: dict[int, tuple[Any, Any]] = {}


def own(installed: Any, replaced: Any) -> None:
    """Count `installed` (put into TVM by this package) as `replaced` in every fingerprint."""
    _own[id(installed)] = (installed, replaced)  # held: no other object takes its id meanwhile


def _replaced(value: Any) -> Any:
    found = _own.get(id(value))
    if found is None and isinstance(value, tvm_ffi.Function):
        # get_global_func makes a new wrapper per call: the Python callable inside is the same object.
        found = _own.get(id(python_callable(value)))
    return value if found is None else found[1]


def lowering_attrs(kind: str) -> tuple[str, ...]:
    """The TIR lowering rules a compile for target kind `kind` reads (on TIR's operators)."""
    return (f"{kind}.FLowerIntrinsic", f"{kind}.FLegalize", f"{kind}.fastmath.FLowerIntrinsic",
            f"{kind}.fastmath.FLegalize")


def slot_fingerprint(label: str, value: Any) -> str | None:
    """The fingerprint of `value` at `label`; None where nothing a compile could read is there."""
    if value is None:
        return None
    value = _replaced(value)
    if isinstance(value, tvm_ffi.Function):
        inner = python_callable(value)
        if inner is None:
            return "native"  # C++ code: TVM's libraries, or one the user loaded (docs/key.md)
        value = inner
    if callable(value):
        return fingerprint(value, label.replace(":", " ", 1))
    if isinstance(value, tvm_ffi.Object):
        return f"{type(value).__qualname__}:{_compat.structural_hash(value) & 0xFFFFFFFFFFFFFFFF:016x}"
    return f"{type(value).__qualname__}:{value!r}"


def slot_fingerprint_or_reason(label: str, value: Any) -> str | None:
    """slot_fingerprint, or "unidentifiable:<why>" where none stands for `value` (compared as any other)."""
    try:
        return slot_fingerprint(label, value)
    except UncacheableError as err:
        return f"unidentifiable:{err.reason}"


def _put(found: dict[str, str], label: str, value: Any) -> None:
    fp = slot_fingerprint_or_reason(label, value)
    if fp is not None:
        found[label] = fp


def read_globals(names: list[str] | None = None) -> dict[str, str]:
    """global:<name> of every global function backed by Python (of `names`, or all)."""
    found: dict[str, str] = {}
    for name in _compat.global_func_names() if names is None else names:
        func = _compat.global_func(name, missing_ok=True)
        if func is not None and python_callable(func) is not None:
            fp = slot_fingerprint_or_reason(f"global:{name}", func)
            if fp != "native":  # this package's router over a C++ function: the C++ function is not seen
                found[f"global:{name}"] = fp
    return found


def read_attrs(kinds: frozenset[str] | None, ops: list[tuple[str, Any]] | None = None, *,
               new_kinds_only: bool = False, relax: bool = True) -> dict[str, str]:
    """op:<op>:<attr> of RELAX_ATTRS, TIR_ATTRS and the lowering rules of `kinds` (None: every
    target kind); new_kinds_only: the lowering rules alone."""
    ops = ops if ops is not None else _compat.operators()
    lowering = tuple(attr for kind in sorted({*DEFAULT_KINDS, *(_compat.target_kinds() if kinds is None else kinds)})
                     for attr in lowering_attrs(kind))
    relax_ops = [(name, op) for name, op in ops if name.startswith(RELAX_OPS)] if relax else []
    tir = [(name, op) for name, op in ops if not name.startswith(RELAX_OPS)]
    found: dict[str, str] = {}
    for chosen, keys in ((relax_ops, RELAX_ATTRS if new_kinds_only is False else ()),
                         (tir, (TIR_ATTRS if new_kinds_only is False else ()) + lowering)):
        for op, attr, value in _compat.op_attr_values(chosen, keys):
            _put(found, f"op:{op}:{attr}", value)
    return found


def read_pipelines() -> dict[str, str]:
    """pipeline:<kind>:<name> of every pipeline registered by name."""
    found: dict[str, str] = {}
    for kind, table in _compat.named_pipelines():
        for name, factory in list(table.items()):
            _put(found, f"pipeline:{kind}:{name}", factory)
    return found


def read_slots(kinds: frozenset[str] | None, *, relax: bool = True) -> dict[str, str]:
    """Every slot a compile for target kinds `kinds` reads (None: every kind), with its fingerprint;
    relax=False: not the Relax operators' attributes."""
    return {**read_globals(), **read_attrs(kinds, relax=relax), **read_pipelines()}


def tvm_modules() -> list[tuple[str, types.ModuleType]]:
    """(name, module) of every imported module of tvm and tvm_ffi."""
    return [(name, module) for name, module in list(sys.modules.items())
            if (name.startswith(("tvm.", "tvm_ffi.")) or name in ("tvm", "tvm_ffi")) and isinstance(module, types.ModuleType)]


def module_digest(name: str, module: types.ModuleType) -> str:
    """A digest of `module`'s callable attributes.

    Modules held as attributes are left out: the import system sets them as modules are
    imported (which differs from process to process), and what is read through one is in that
    module's own digest.
    """
    texts = []
    function, ffi = types.FunctionType, tvm_ffi.Function
    for attribute, value in list(vars(module).items()):  # one step in C: an import on another thread may add to it
        kind = type(value)
        # The common cases inline (the others as _callable_text has them): TVM's own plain
        # function by where it is defined, and a Function at an `_ffi_api` name.
        if kind is function and not value.__closure__ and id(value) not in _own \
                and code_owner(value.__code__.co_filename) != "user":
            text = f"f:{value.__module__}.{value.__qualname__}:{value.__code__.co_firstlineno}"
        elif kind is ffi and id(value) not in _own:
            text = "ffi"
        elif kind is types.ModuleType or not callable(value):
            continue
        else:
            text = _callable_text(f"{name}.{attribute}", value)
        texts.append(f"{attribute}={text}")
    texts.sort()
    return xxhash.xxh3_64_hexdigest(";".join(texts).encode())


def _callable_text(label: str, value: Any, depth: int = 0) -> str:
    """A module attribute's text: by name where the install digest or a version pins its code."""
    value = _replaced(value)
    kind = type(value)
    if kind is types.FunctionType:
        code = value.__code__
        if code_owner(code.co_filename) != "user":
            text = f"f:{value.__module__}.{value.__qualname__}:{code.co_firstlineno}"
            if value.__closure__ and depth < 2:  # a decorator's wrapper: what it wraps, with what
                text += "(" + ",".join(_cell_text(label, cell, depth) for cell in value.__closure__) + ")"
            return text
    elif isinstance(value, type):
        if _class_owner(value) != "user":
            return f"c:{value.__module__}.{value.__qualname__}"
    elif kind is tvm_ffi.Function:
        # A Function at a module attribute (an `_ffi_api` name, bound at import) is keyed as one:
        # the registry's global functions, where a Python override goes, are keyed by their code.
        return "ffi"
    elif kind not in (functools.partial, types.MethodType) and _class_owner(kind) != "user":
        # An instance of TVM's or a library's class (a dtype constructor, a typing form), by its type.
        return f"o:{kind.__module__}.{kind.__qualname__}"
    try:
        return fingerprint(value, label)
    except UncacheableError as err:
        return f"unidentifiable:{err.reason}"


def _cell_text(label: str, cell: types.CellType, depth: int) -> str:
    try:
        content = cell.cell_contents
    except ValueError:
        return "empty"
    if callable(content):
        return _callable_text(label, content, depth + 1)
    if isinstance(content, (type(None), bool, int, float, str, bytes)):
        return repr(content)
    return f"o:{type(content).__module__}.{type(content).__qualname__}"


def _class_owner(klass: type) -> str:
    if klass.__module__ == "builtins":
        return "library"
    return code_owner(getattr(sys.modules.get(klass.__module__), "__file__", None) or "<unknown>")


def read_modules(names: list[str] | None = None) -> dict[str, str]:
    """name -> module_digest of every imported tvm and tvm_ffi module (of `names`, or all)."""
    chosen = tvm_modules() if names is None else [(n, sys.modules[n]) for n in names if n in sys.modules]
    return {name: module_digest(name, module) for name, module in chosen}
