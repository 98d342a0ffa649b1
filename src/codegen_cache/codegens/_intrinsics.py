"""TVM's table of CUDA device-intrinsic codegens, an input of target.build.cuda, as a key part.

target.build.cuda asks `tirx.intrinsics.cuda.get_codegen` for the code of each device intrinsic
a kernel calls; it answers from tvm.backend.cuda.codegen.CODEGEN_REGISTRY, which users extend
with `register_codegen`. TVM's own entries are covered by the TVM version; others are keyed as
callbacks are (docs/key.md).
"""

from __future__ import annotations

import xxhash

from .._errors import UncacheableError
from ._callbacks import declared_salt, object_identity, tvm_name, unchanged

__all__ = ["GET_CODEGEN", "intrinsics_identity"]

GET_CODEGEN = "tirx.intrinsics.cuda.get_codegen"


def intrinsics_identity(get_codegen: str | None = None) -> str:
    """Identity of TVM's CUDA device-intrinsic codegen table, which target.build.cuda reads.

    'tvm' while every entry is TVM's own (the TVM version is a key part); else a digest of the
    other entries' identities (as callbacks', docs/key.md). Memoized per table size: adding an
    entry is seen at once, replacing one in place is not (declare a salt for
    tirx.intrinsics.cuda.get_codegen after doing that).
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
    if memo is not None and memo[0] is table and memo[1] == len(table) and unchanged(memo[4]):
        if memo[3] is not None:
            raise memo[3]
        return memo[2]
    identity, error, watch = "tvm", None, []
    digest = xxhash.xxh3_128()
    try:
        for op in sorted(table):
            func = table[op]
            if tvm_name(getattr(func, "__wrapped__", func)) is not None:
                continue  # TVM's own codegen for this op
            found, seen = object_identity(func, f"the CUDA intrinsic codegen for {op!r}", GET_CODEGEN)
            watch += seen
            digest.update(f"{len(op)}:{op}{len(found)}:{found}".encode())
            identity = f"user:{digest.hexdigest()}"
    except UncacheableError as err:
        error = err
    _intrinsics_memo["table"] = (table, len(table), identity, error, tuple(watch))
    if error is not None:
        raise error
    return identity


_intrinsics_memo: dict[str, tuple] = {}


def _intrinsic_table() -> dict | None:
    # The dict get_codegen itself reads, from its module's globals (the module object TVM
    # exposes is a lazy proxy whose attribute access costs a microsecond).
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
