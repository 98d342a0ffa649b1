"""TVM's table of CUDA device-intrinsic codegens, an input of target.build.cuda, as a key part.

target.build.cuda asks `tirx.intrinsics.cuda.get_codegen` for the code of each device intrinsic
a kernel calls; it answers from tvm.backend.cuda.codegen.CODEGEN_REGISTRY, which users extend
with `register_codegen`. TVM's own entries are covered by the TVM version; others are keyed as
callbacks are: a user's entry makes CUDA uncacheable until a salt is declared for
tirx.intrinsics.cuda.get_codegen (docs/key.md).
"""

from __future__ import annotations

import types

from ._callbacks import declared_salt, tvm_name, users_function

__all__ = ["GET_CODEGEN", "intrinsics_identity"]

GET_CODEGEN = "tirx.intrinsics.cuda.get_codegen"


def intrinsics_identity(get_codegen: str | None = None) -> str:
    """Identity of TVM's CUDA device-intrinsic codegen table, which target.build.cuda reads.

    'tvm' while every entry is TVM's own (the TVM version is a key part); a user's entry raises
    UncacheableError (as a user's callback does, docs/key.md) unless a salt is declared for
    tirx.intrinsics.cuda.get_codegen: then 'declared:<salt>'. Memoized per table size: adding an
    entry is seen at once, replacing one in place is not (declare a salt after doing that).
    """
    # `get_codegen`: that callback's identity when the caller has it (saves a lookup).
    if get_codegen is None:
        declared = declared_salt(GET_CODEGEN)
        get_codegen = "" if declared is None else f"declared:{declared}"
    if get_codegen.startswith("declared:"):
        return get_codegen
    table = _intrinsic_table()
    if table is None:
        return "none"
    memo = _intrinsics_memo.get("table")
    if memo is None or memo[0] is not table or memo[1] != len(table):
        # TVM's ~670 entries are closures of ~20 functions: each code object is classified once
        # (by id: the table holds the functions, and so their code, while this runs).
        by_code: dict[int, bool] = {}
        users = []
        for op, func in table.items():
            func = getattr(func, "__wrapped__", func)
            if type(func) is types.FunctionType:
                ours = by_code.get(id(func.__code__))
                if ours is None:
                    ours = by_code[id(func.__code__)] = tvm_name(func) is not None
            else:
                ours = tvm_name(func) is not None
            if not ours:
                users.append(op)
        error = users_function(f"the CUDA intrinsic codegen for {min(users)!r}", GET_CODEGEN) if users else None
        memo = _intrinsics_memo["table"] = (table, len(table), error)
    if memo[2] is not None:
        raise memo[2]
    return "tvm"


_intrinsics_memo: dict[str, tuple] = {}


def _intrinsic_table() -> dict | None:
    # The dict get_codegen itself reads, from its module's globals (the module object TVM
    # exposes is a lazy proxy, slow on every attribute access).
    scope = _intrinsic_scope[0] if _intrinsic_scope else _find_intrinsic_scope()
    return None if scope is None else scope.get("CODEGEN_REGISTRY")


_intrinsic_scope: list = []


def _find_intrinsic_scope() -> dict | None:
    try:
        from tvm.backend.cuda.codegen.registry import register_codegen
    except ImportError:  # a TVM without Python-side CUDA intrinsics (tilelang's bundled one)
        scope = None
    else:
        scope = getattr(register_codegen, "__globals__", None)  # the module get_codegen reads
    _intrinsic_scope[:] = [scope]
    return scope
