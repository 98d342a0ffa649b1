"""What a Relax compile reads besides its input: Python registered into TVM, and the tuning database in context.

Two parts of the model key (_relax.py):

    registered   every Python object registered into TVM that is not TVM's own, by its identity
                 (_identity.py: a declared salt, else a digest of its code): global functions
                 (tvm_ffi.register_global_func), the operator attributes the compile reads
                 (RELAX_ATTRS of Relax operators; the lowering rules of the compile's target
                 kinds, lowering_attrs, of the others), pipelines registered by name (Relax's
                 and TIR's PIPELINE_MAP). TVM's own are keyed by TVM's version, a static salt:
                 which of TVM's modules a process imported does not change the key. Functions
                 of C++ code (TVM's libraries, a library the user loaded) are not seen.
    database     the MetaSchedule database in context (`with database:`): a digest of all its
                 records (a superset of those that apply), memoized per (database, record count).

Something unidentifiable (UncacheableError) makes that compile skip the model-level cache.

Finding the registrations is a scan of TVM's registries (every global function, those operator
attributes), done once per process at the first model key (the lowering rules once per target
kind), and not at all where enable() ran as `import tvm` completed (nothing else can have
registered before). Afterwards
registrations are tracked through wrappers that enable() installs over the module attributes
TVM's Python registration functions call (_compat.REGISTRATION_POINTS) and disable() removes;
enable() marks the scan stale, so what was registered while not enabled is found again. Where
a point is missing (another tvm-ffi), the scan runs on every model key. Per compile, only the
registrations found not to be TVM's are looked up again and digested (a redefined helper is seen).
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import xxhash

from .. import _compat
from .._compat import tvm_ffi
from .._errors import UncacheableError
from .._forksafe import renew_after_fork
from ..codegens._pyfunc import python_callable
from ._identity import identity, in_tvm

__all__ = ["RELAX_ATTRS", "database_part", "install_hooks", "lowering_attrs", "registered_part", "uninstall_hooks"]

# Operator attributes TVM 0.27's Relax passes read whose value may be a Python function (the
# attribute names in its compiler library), on Relax operators (`relax.*`). FCallPacked (a
# string), FPurity and FDataDependent (booleans) hold no function: a plain value set from outside
# TVM is found through the wrapped registration points only.
RELAX_ATTRS = ("FLegalize", "FPrimalGradient", "FInferMixedPrecision", "FLowerBuiltin", "FNormalize",
               "FRelaxInferLayout", "FValidate", "FInferStructInfo")
RELAX_OPS = "relax."


def lowering_attrs(kind: str) -> tuple[str, ...]:
    """The TIR lowering rules a compile for target kind `kind` reads (on the other operators)."""
    return (f"{kind}.FLowerIntrinsic", f"{kind}.FLegalize", f"{kind}.fastmath.FLowerIntrinsic",
            f"{kind}.fastmath.FLegalize")


# Read by a compile for any target kind.
DEFAULT_KINDS = ("default", "fastmath")

_lock = threading.RLock()
renew_after_fork(globals(), "_lock", threading.RLock)  # the state itself holds in the child
# scanned: the global functions and Relax attributes were scanned (False: at the next model key);
# kinds: the target kinds whose lowering rules were (None: all, nothing was registered before
# the wrappers); hooked: every registration point is
# wrapped; globals / attrs: the registrations found not to be TVM's (name, (op, attr)).
_state: dict[str, Any] = {"scanned": False, "kinds": set(), "hooked": False, "globals": set(), "attrs": set(),
                          "dirty_globals": set(), "dirty_attrs": {}, "wrapped": []}
_database_memo: dict[str, Any] = {"held": None, "size": -1, "digest": ""}


def registered_part(kinds: frozenset[str]) -> str:
    """The `registered` key part of a compile for target kinds `kinds`: '' where only TVM's own is
    registered; UncacheableError where something is unidentifiable."""
    read = {*DEFAULT_KINDS, *kinds}
    with _lock:
        ops = None  # listed once for both scans: a listing walks all ~1,000 operators
        if not (_state["scanned"] and _state["hooked"]):
            ops = _compat.operators()
            _scan(ops)
            _state["scanned"], _state["kinds"] = True, set()
        new = set() if _state["kinds"] is None else read - _state["kinds"]
        if new:
            _scan_lowering(new, ops if ops is not None else _compat.operators())
            if _state["hooked"]:
                _state["kinds"] |= new
        _recheck()
        names = sorted(_state["globals"])
        attrs = sorted(slot for slot in _state["attrs"] if _reads_attr(slot[1], read))
    found: list[tuple[str, str]] = []
    for name in names:
        func = _compat.global_func(name, missing_ok=True)
        if func is not None:
            _add(found, f"global:{name}", func)
    for op, attr in attrs:
        _add(found, f"op:{op}:{attr}", _compat.op_attr(op, attr))
    for kind, table in _compat.named_pipelines():
        for name, factory in sorted(table.items(), key=lambda item: str(item[0])):
            if not _tvms(factory):
                _add(found, f"{kind}_pipeline:{name}", factory)
    if not found:
        return ""
    digest = xxhash.xxh3_128()
    for label, value in found:
        digest.update(f"{len(label)}:{label}={value};".encode())
    return digest.hexdigest()


def _add(found: list[tuple[str, str]], label: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, tvm_ffi.Function) or callable(value):
        digest = identity(value, label.replace(":", " ", 1))
        if digest is not None:
            found.append((label, digest))
    else:
        # A plain value (an int, a string, an IR object) set from outside TVM's own code.
        found.append((label, f"{type(value).__qualname__}:{_plain(value)}"))


def _plain(value: Any) -> str:
    if isinstance(value, tvm_ffi.Object):
        return f"{_compat.structural_hash(value) & 0xFFFFFFFFFFFFFFFF:016x}"
    return repr(value)


def _tvms(value: Any) -> bool:
    """Whether a registered value is TVM's own (or C++ code, which is not seen)."""
    if isinstance(value, tvm_ffi.Function):
        value = python_callable(value)
        if value is None:
            return True  # C++ code: TVM's libraries, or one the user loaded (not seen, docs/key.md)
    if isinstance(value, types.FunctionType) and value.__closure__ is None and in_tvm(value.__code__.co_filename):
        return True
    try:
        return identity(value, "") is None
    except UncacheableError:
        return False  # a user's: the model key says so when it is taken


def _reads_attr(attr: str, kinds: set[str]) -> bool:
    """Whether a compile for `kinds` reads attribute `attr` (Relax attributes, its kinds' lowering rules)."""
    return "." not in attr or attr.split(".", 1)[0] in kinds


def _scan(ops: list[tuple[str, Any]]) -> None:
    """Find the users' global functions, and their Relax attributes of `ops` (from _compat.operators())."""
    users = set()
    for name in _compat.global_func_names():
        func = _compat.global_func(name, missing_ok=True)
        if func is not None and not _tvms(func):
            users.add(name)
    # A plain value a user set (found through a wrapped point only) stays until it is reset.
    plain = {slot for slot in _state["attrs"] if not isinstance(_compat.op_attr(*slot), (tvm_ffi.Function, type(None)))}
    _state["globals"], _state["attrs"] = users, _users_attrs(ops, RELAX_ATTRS, relax=True) | plain


def _scan_lowering(kinds: set[str], ops: list[tuple[str, Any]]) -> None:
    """Add the users' lowering rules of `kinds` (scanned once per kind while the wrappers hold)."""
    attrs = tuple(attr for kind in sorted(kinds) for attr in lowering_attrs(kind))
    _state["attrs"] |= _users_attrs(ops, attrs, relax=False)


def _users_attrs(ops: list[tuple[str, Any]], attrs: tuple[str, ...], *, relax: bool) -> set[tuple[str, str]]:
    found = set()
    chosen = [(name, op) for name, op in ops if name.startswith(RELAX_OPS) == relax]
    for op, attr, value in _compat.op_attr_values(chosen, attrs):
        if isinstance(value, tvm_ffi.Function) and not _tvms(value):
            found.add((op, attr))
    return found


def _recheck() -> None:
    """Classify what was registered through a wrapped point since the last model key."""
    for name in _state["dirty_globals"]:
        func = _compat.global_func(name, missing_ok=True)
        (_state["globals"].discard if func is None or _tvms(func) else _state["globals"].add)(name)
    for slot, by_tvm in _state["dirty_attrs"].items():
        value = _compat.op_attr(*slot)
        keep = value is not None and not by_tvm and not (isinstance(value, tvm_ffi.Function) and _tvms(value))
        (_state["attrs"].add if keep else _state["attrs"].discard)(slot)
    _state["dirty_globals"], _state["dirty_attrs"] = set(), {}


# ---- the registration points ------------------------------------------------------------------


def install_hooks(*, registered_before: bool = True) -> None:
    """Wrap TVM's registration points (enable()); the scan is stale: what was registered meanwhile is found.

    registered_before=False: the wrappers go in as `import tvm` completes (CODEGEN_CACHE_ENABLE),
    before any other code can register; what is registered then is TVM's own, so no scan is needed.
    """
    with _lock:
        _state["scanned"] = False
        if _state["wrapped"]:
            return
        hooked = True
        for module, attribute in _compat.REGISTRATION_POINTS:
            original = getattr(module, attribute, None) if module is not None else None
            if not callable(original):
                hooked = False  # the fallback: a full scan on every model key
                continue
            wrapper = _wrapper(attribute, original)
            setattr(module, attribute, wrapper)
            _state["wrapped"].append((module, attribute, original, wrapper))
        _state["hooked"] = hooked
        _state["dirty_globals"], _state["dirty_attrs"] = set(), {}
        if hooked and not registered_before:
            _state["scanned"], _state["globals"], _state["attrs"] = True, set(), set()
            _state["kinds"] = None  # every kind: nothing to scan for any


def uninstall_hooks() -> None:
    """Undo install_hooks (disable()); a point someone wrapped over ours keeps their wrapper, ours forwarding."""
    with _lock:
        for module, attribute, original, wrapper in _state["wrapped"]:
            if getattr(module, attribute, None) is wrapper:
                setattr(module, attribute, original)
        _state["wrapped"] = []
        _state["hooked"] = False
        _state["scanned"] = False


def _wrapper(attribute: str, original: Callable[..., Any]) -> Callable[..., Any]:
    if attribute == "_register_global_func":
        def register_global_func(name, func, override, *args):
            result = original(name, func, override, *args)
            _touched_global(name)
            return result

        return register_global_func

    def register_op_attr(op, key, *args):
        result = original(op, key, *args)
        _touched_attr(op if isinstance(op, str) else getattr(op, "name", str(op)), key)
        return result

    register_op_attr.__name__ = attribute
    return register_op_attr


def _touched_global(name: Any) -> None:
    with _lock:
        if _state["hooked"]:
            _state["dirty_globals"].add(str(name))


def _touched_attr(op: str, key: Any) -> None:
    # A plain value (an int, a string) cannot say whose it is: the code that registered it does.
    by_tvm = _registered_by_tvm()
    with _lock:
        if _state["hooked"]:
            _state["dirty_attrs"][(op, str(key))] = by_tvm


def _registered_by_tvm() -> bool:
    """Whether the first caller outside the registration functions is TVM's code."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or frame.f_code.co_filename.endswith(_REGISTRATION_FILES)):
        frame = frame.f_back
    return frame is not None and in_tvm(frame.f_code.co_filename)


_REGISTRATION_FILES = ("tvm/ir/op.py", "tvm/relax/transform/legalize_ops/common.py", "tvm/tirx/op.py")


# ---- the tuning database ------------------------------------------------------------------------


def database_part() -> str:
    """The `database` key part: '' with no database in context, else a digest of its records."""
    database = _compat.current_database()
    if database is None:
        return ""
    size = len(database)
    with _lock:
        memo = _database_memo  # Database.current() gives a new wrapper per call: compared by handle
        if memo["held"] is not None and memo["held"].same_as(database) and memo["size"] == size:
            return memo["digest"]
    digest = xxhash.xxh3_128()
    digest.update(f"{type(database).__module__}.{type(database).__qualname__}".encode())
    for record in database.get_all_tuning_records():
        digest.update(_compat.save_json(record.as_json()).encode())
        digest.update(_compat.save_json(record.workload.mod).encode())
    found = digest.hexdigest()
    with _lock:
        _database_memo.update(held=database, size=size, digest=found)  # held: its id is not reused meanwhile
    return found
