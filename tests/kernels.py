"""Kernels the tests lower: TVMScript needs them in a real source file."""

import tvm
import tvm.s_tir  # noqa: F401
from tvm.script import tirx as T

from codegen_cache._cli._demo_kernels import vadd, vadd_gpu  # noqa: F401  the same kernels the demo lowers


@T.prim_func(s_tir=True)
def vmul(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    for i in range(1024):
        with T.sblock("C"):
            vi = T.axis.spatial(1024, i)
            C[vi] = A[vi] * B[vi]


@T.prim_func(s_tir=True)
def vmul_gpu(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    for i in T.thread_binding(8, thread="blockIdx.x"):
        for j in T.thread_binding(128, thread="threadIdx.x"):
            with T.sblock("C"):
                vi = T.axis.spatial(1024, i * 128 + j)
                C[vi] = A[vi] * B[vi]


def vadds(count: int = 8):
    """`count` vector adds in one module (vadd0, vadd1, ...): its llvm entry is over diskcache's
    32 KiB inline limit, so it lives in a value file (the tests of value files need one)."""
    return tvm.IRModule({f"vadd{i}": vadd.with_attr("global_symbol", f"vadd{i}") for i in range(count)})
