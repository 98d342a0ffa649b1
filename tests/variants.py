"""Many distinct small llvm kernels (one per constant) for multi-key tests, lowered on demand."""

from __future__ import annotations

import functools

import tvm
import tvm.s_tir  # noqa: F401
from tvm import te

import codegen_cache as cc


@functools.lru_cache(maxsize=None)
def variant(i: int):
    """(module, target) of `C[j] = A[j] + i` named add_<i>: distinct keys for distinct i."""
    a = te.placeholder((256,), name="A", dtype="float32")
    c = te.compute((256,), lambda j: a[j] + float(i), name="C")
    func = te.create_prim_func([a, c]).with_attr("global_symbol", f"add_{i}")
    return cc.prepare_for_codegen(tvm.IRModule({f"add_{i}": func}), "llvm")
