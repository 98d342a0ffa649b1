"""Kernels the demo lowers (TVMScript needs them in a source file)."""

import tvm.s_tir  # noqa: F401
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def vadd(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    for i in range(1024):
        with T.sblock("C"):
            vi = T.axis.spatial(1024, i)
            C[vi] = A[vi] + B[vi]


@T.prim_func(s_tir=True)
def vadd_gpu(A: T.Buffer((1024,), "float32"), B: T.Buffer((1024,), "float32"), C: T.Buffer((1024,), "float32")):
    for i in T.thread_binding(8, thread="blockIdx.x"):
        for j in T.thread_binding(128, thread="threadIdx.x"):
            with T.sblock("C"):
                vi = T.axis.spatial(1024, i * 128 + j)
                C[vi] = A[vi] + B[vi]


@T.prim_func(s_tir=True)
def matmul_gpu(A: T.Buffer((256, 256), "float32"), B: T.Buffer((256, 256), "float32"), C: T.Buffer((256, 256), "float32")):
    for bx in T.thread_binding(16, thread="blockIdx.x"):
        for by in T.thread_binding(16, thread="blockIdx.y"):
            for tx in T.thread_binding(16, thread="threadIdx.x"):
                for ty in T.thread_binding(16, thread="threadIdx.y"):
                    for k in range(256):
                        with T.sblock("C"):
                            vi = T.axis.spatial(256, bx * 16 + tx)
                            vj = T.axis.spatial(256, by * 16 + ty)
                            vk = T.axis.reduce(256, k)
                            with T.init():
                                C[vi, vj] = T.float32(0)
                            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
