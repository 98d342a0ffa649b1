"""Benchmark kernels in TVMScript (the parser needs them in a real source file).

Each factory returns a PrimFunc or IRModule; `gpu=True` binds loops to CUDA threads so the
same kernel lowers for llvm/c (host code) and for cuda (device code).

Parsing TVMScript costs 0.1-0.4 s a function, 10x the lowering of these kernels, so the
kernels that come in many variants (vector adds with different constants, the matmul tile
configurations) are parsed once with their knobs as scalar parameters, then specialized
(`PrimFunc.specialize`, ~0.3 ms), which leaves the same constant-shaped kernel.
"""

from __future__ import annotations

import functools

import tvm
import tvm.s_tir  # noqa: F401  TVMScript's s_tir=True needs the schedule dialect registered
from tvm.ir import IRModule
from tvm.script import tirx as T

__all__ = [
    "KERNELS", "SMOKE_KERNELS", "body", "kernel", "kernel_set", "many_functions", "matmul",
    "matmul_cpu_configs", "matmul_sweep_configs", "vadd",
]


def _specialize(func, **values):
    params = {p.name: p for p in func.params}
    return func.specialize({params[k]: v for k, v in values.items()})


@functools.lru_cache(maxsize=None)
def _vadd_template(gpu: bool, n: int):
    if gpu:
        blocks = n // 128

        @T.prim_func(s_tir=True)
        def func(A: T.Buffer((n,), "float32"), B: T.Buffer((n,), "float32"), C: T.Buffer((n,), "float32"),
                 scale: T.float32):
            for i in T.thread_binding(blocks, thread="blockIdx.x"):
                for j in T.thread_binding(128, thread="threadIdx.x"):
                    with T.sblock("C"):
                        vi = T.axis.spatial(n, i * 128 + j)
                        C[vi] = A[vi] + B[vi] * scale

        return func

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((n,), "float32"), B: T.Buffer((n,), "float32"), C: T.Buffer((n,), "float32"),
             scale: T.float32):
        for i in range(n):
            with T.sblock("C"):
                vi = T.axis.spatial(n, i)
                C[vi] = A[vi] + B[vi] * scale

    return func


def vadd(gpu: bool = False, n: int = 1024, scale: float = 1.0, name: str = "vadd"):
    """C = A + scale * B over n floats (128 threads per block on the GPU)."""
    func = _specialize(_vadd_template(gpu, n), scale=tvm.tirx.FloatImm("float32", scale))
    return func.with_attr("global_symbol", name)


@functools.lru_cache(maxsize=None)
def _matmul_cpu_template(n: int):
    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((n, n), "float32"), B: T.Buffer((n, n), "float32"), C: T.Buffer((n, n), "float32"),
             bm: T.int32, bn: T.int32, bk: T.int32):
        for io, jo, ko, ii, ki, ji in T.grid(n // bm, n // bn, n // bk, bm, bk, bn):
            with T.sblock("C"):
                vi = T.axis.spatial(n, io * bm + ii)
                vj = T.axis.spatial(n, jo * bn + ji)
                vk = T.axis.reduce(n, ko * bk + ki)
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

    return func


@functools.lru_cache(maxsize=None)
def _matmul_gpu_template(n: int):
    # threads per block = (bm // tm) * (bn // tn); each thread computes a tm x tn patch, and the
    # block stages A and B tiles of bk columns/rows through shared memory.
    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((n, n), "float32"), B: T.Buffer((n, n), "float32"), C: T.Buffer((n, n), "float32"),
             bm: T.int32, bn: T.int32, bk: T.int32, tm: T.int32, tn: T.int32):
        for by in T.thread_binding(n // bm, thread="blockIdx.y"):
            for bx in T.thread_binding(n // bn, thread="blockIdx.x"):
                for ty in T.thread_binding(bm // tm, thread="threadIdx.y"):
                    for tx in T.thread_binding(bn // tn, thread="threadIdx.x"):
                        with T.sblock("tile"):
                            T.reads(A[by * bm : by * bm + bm, 0:n], B[0:n, bx * bn : bx * bn + bn])
                            T.writes(C[by * bm + ty * tm : by * bm + ty * tm + tm,
                                       bx * bn + tx * tn : bx * bn + tx * tn + tn])
                            As = T.alloc_buffer((bm, bk), "float32", scope="shared")
                            Bs = T.alloc_buffer((bk, bn), "float32", scope="shared")
                            acc = T.alloc_buffer((tm, tn), "float32", scope="local")
                            for i, j in T.grid(tm, tn):
                                acc[i, j] = T.float32(0)
                            for ko in range(n // bk):
                                for e in range((bm * bk + (bm // tm) * (bn // tn) - 1) // ((bm // tm) * (bn // tn))):
                                    if e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx < bm * bk:
                                        As[(e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx) // bk,
                                           (e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx) % bk] = A[
                                            by * bm + (e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx) // bk,
                                            ko * bk + (e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx) % bk]
                                for e in range((bk * bn + (bm // tm) * (bn // tn) - 1) // ((bm // tm) * (bn // tn))):
                                    if e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx < bk * bn:
                                        Bs[(e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx) // bn,
                                           (e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx) % bn] = B[
                                            ko * bk + (e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx) // bn,
                                            bx * bn + (e * (bm // tm) * (bn // tn) + ty * (bn // tn) + tx) % bn]
                                T.tvm_storage_sync("shared")
                                for ki, i, j in T.grid(bk, tm, tn):
                                    acc[i, j] = acc[i, j] + As[ty * tm + i, ki] * Bs[ki, tx * tn + j]
                                T.tvm_storage_sync("shared")
                            for i, j in T.grid(tm, tn):
                                C[by * bm + ty * tm + i, bx * bn + tx * tn + j] = acc[i, j]

    return func


def matmul(gpu: bool = False, n: int = 256, bm: int = 32, bn: int = 32, bk: int = 16, tm: int = 1, tn: int = 1):
    """A tiled n x n x n float32 matmul.

    CPU: (bm x bn) output tiles, k split by bk, innermost j contiguous.
    GPU: one (bm x bn) output tile per block, each thread computing tm x tn outputs, k staged
    through shared memory in slices of bk.
    """
    if gpu:
        func = _specialize(_matmul_gpu_template(n), bm=bm, bn=bn, bk=bk, tm=tm, tn=tn)
    else:
        func = _specialize(_matmul_cpu_template(n), bm=bm, bn=bn, bk=bk)
    return func.with_attr("global_symbol", "matmul")


def matmul_sweep_configs() -> list[dict[str, int]]:
    """The 54 configurations of the CUDA matmul sweep: bm, bn in {16,32,64}, bk in {8,16,32}, tm=tn in {1,2}."""
    return [
        {"bm": bm, "bn": bn, "bk": bk, "tm": t, "tn": t}
        for bm in (16, 32, 64)
        for bn in (16, 32, 64)
        for bk in (8, 16, 32)
        for t in (1, 2)
    ]


def matmul_cpu_configs() -> list[dict[str, int]]:
    """The llvm sweep: bm, bn in {16, 32, 64}, bk in {8, 16, 32} (27 configurations)."""
    return [{"bm": bm, "bn": bn, "bk": bk} for bm in (16, 32, 64) for bn in (16, 32, 64) for bk in (8, 16, 32)]


def many_functions(gpu: bool = False, count: int = 64) -> IRModule:
    """An IRModule of `count` distinct vector adds (each its own symbol and constant)."""
    return IRModule({f"f{i}": vadd(gpu, scale=float(i + 1), name=f"f{i}") for i in range(count)})


def body(gpu: bool = False, statements: int = 2048):
    """One function whose body is `statements` unrolled stores (B[i] = A[i] * 2 + 1)."""
    n = statements
    if gpu:

        @T.prim_func(s_tir=True)
        def func(A: T.Buffer((n * 32,), "float32"), B: T.Buffer((n * 32,), "float32")):
            for t in T.thread_binding(32, thread="threadIdx.x"):
                for i in T.unroll(n):
                    B[i * 32 + t] = A[i * 32 + t] * T.float32(2) + T.float32(1)
    else:

        @T.prim_func(s_tir=True)
        def func(A: T.Buffer((n,), "float32"), B: T.Buffer((n,), "float32")):
            for i in T.unroll(n):
                B[i] = A[i] * T.float32(2) + T.float32(1)

    return func.with_attr("global_symbol", "body")


# name -> factory(gpu) of the four benchmark kernels
KERNELS = {
    "vadd": lambda gpu: vadd(gpu),
    "matmul": lambda gpu: matmul(gpu),
    "64 funcs": lambda gpu: many_functions(gpu),
    "2048 stmts": lambda gpu: body(gpu),
}

# A tiny set for the smoke test: each code path once, in seconds.
SMOKE_KERNELS = {
    "vadd": lambda gpu: vadd(gpu),
    "2 funcs": lambda gpu: many_functions(gpu, 2),
}


def kernel_set(smoke: bool = False) -> dict:
    """name -> factory(gpu) of the kernels a run measures."""
    return SMOKE_KERNELS if smoke else KERNELS


def kernel(name: str, gpu: bool):
    """The named benchmark kernel (smoke names included), for the GPU or the CPU."""
    return {**SMOKE_KERNELS, **KERNELS}[name](gpu)
