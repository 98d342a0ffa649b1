"""The build key's hash of its input: independent stores hashed in one order (see input_hash).

TVM's Relax VM emits the stores of a shape function in an order that depends on object addresses,
so one model gives another TIR module in another process; those stores are independent (checked
here), so either order's build is the other's.
"""

from __future__ import annotations

from .. import _compat
from .._compat import IRModule
from .._key import _combined, ir_hash

__all__ = ["input_hash"]


def _classes(*found) -> tuple[type, ...]:
    # TVM moves node classes between versions (0.27's BufferLoad is a function making a
    # tvm.ir.TensorLoad): whichever of the names is a class here.
    return tuple(c for c in found if isinstance(c, type))


_tvm = _compat.tvm
_BINARY = _classes(*(getattr(_tvm.tirx, n, None) for n in ("Add", "Sub", "Mul", "Div", "Mod", "FloorDiv",
                                                          "FloorMod", "Min", "Max")))
_LEAVES = _classes(getattr(_tvm.tirx, "IntImm", None), getattr(_tvm.tirx, "Var", None))
_CASTS = _classes(getattr(_tvm.tirx, "Cast", None))
_LOADS = _classes(getattr(_tvm.ir, "TensorLoad", None), getattr(_tvm.tirx, "BufferLoad", None))
_STORES = _classes(getattr(_tvm.tirx, "BufferStore", None))
_SEQS = _classes(getattr(_tvm.tirx, "SeqStmt", None))
_INTS = _classes(getattr(_tvm.tirx, "IntImm", None))
_BY_ORDER = b"cgc-input-independent-stores\0"  # another prefix than ir_hash's: another form


def _loaded_from(load):
    return getattr(load, "source", None) if getattr(load, "buffer", None) is None else load.buffer


def _reads(expr, found: list) -> bool:
    """Collect the loads of an integer arithmetic expression; False for any other kind of node."""
    if isinstance(expr, _LEAVES):
        return True
    if isinstance(expr, _BINARY):
        return _reads(expr.a, found) and _reads(expr.b, found)
    if isinstance(expr, _CASTS):
        return _reads(expr.value, found)
    if isinstance(expr, _LOADS):
        found.append(expr)
        return all(_reads(i, found) for i in expr.indices)
    return False  # a call, a let, anything this walk does not know: not reordered


def _constant_index(node) -> int | None:
    indices = node.indices
    return int(indices[0].value) if len(indices) == 1 and isinstance(indices[0], _INTS) else None


def _independent_stores(body) -> list | None:
    """The statements of `body` by stored index, when they are independent stores; else None.

    Independent: each a store of integer arithmetic to a distinct constant index of one buffer,
    every load in them from that buffer at a constant index that none of them writes. Such
    statements leave the same buffer in any order. The Relax VM's shape function is one
    (vm_shape_lower.cc emits its stores in the order of an unordered_map that hashes a free
    variable by its address, which changes between processes).
    """
    if not _SEQS or not _STORES or not _LOADS or not isinstance(body, _SEQS) or len(body.seq) < 2:
        return None
    by_index, buffer = {}, None
    for stmt in body.seq:
        index = _constant_index(stmt) if isinstance(stmt, _STORES) else None
        buffer = stmt.buffer if buffer is None and index is not None else buffer
        if index is None or not stmt.buffer.same_as(buffer) or index in by_index:
            return None
        by_index[index] = stmt
    for stmt in body.seq:
        loads: list = []
        if not _reads(stmt.value, loads):
            return None
        for load in loads:
            source, index = _loaded_from(load), _constant_index(load)
            # A load of anything else (another buffer, a computed index) may alias: not reordered.
            if source is None or not source.same_as(buffer) or index is None or index in by_index:
                return None
    return [by_index[i] for i in sorted(by_index)]


def input_hash(mod: IRModule) -> int:
    """ir_hash of a build's input, with independent stores in one order (codegen_cache.build's key).

    TVM's Relax VM emits the stores of its shape function in an order that depends on object
    addresses, so the same model gives another TIR module in another process; the stores are
    independent (checked), so either order's build is the other's, and both get this hash. A
    module with no such function keeps ir_hash's value.
    """
    functions = mod.functions
    reordered = {}
    for gv, func in functions.items():
        ordered = _independent_stores(func.body) if isinstance(func, _compat.PrimFunc) else None
        if ordered is not None:
            reordered[gv.name_hint] = func.with_body(_SEQS[0](ordered))
    if not reordered:
        return ir_hash(mod)
    return _combined(_BY_ORDER, mod, {gv.name_hint: reordered.get(gv.name_hint, func) for gv, func in functions.items()})
