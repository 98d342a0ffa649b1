"""Kernels the demo and `doctor` lower (TVMScript needs them in a source file).

Also a kernels source for `codegen-cache warm codegen_cache._cli._demo_kernels -t ...`:
`variants(target)` gives the 54 CUDA matmul tile configs for GPU targets and the CPU
matmul schedules for llvm/c.
"""

import itertools

from .._compat import script_tirx as T
from .._compat import tvm

N = 512
# The sweep an autotuner would try: threads per block (x, y) and the k-loop unroll factor.
CUDA_TILES = tuple(itertools.product((8, 16, 32), (8, 16, 32), (1, 2, 4, 8, 16, 32)))  # 54 configs
CPU_TILES = tuple(itertools.product((8, 16, 32), (8, 16, 32), (1, 4)))  # 18 configs


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
def matmul(A: T.Buffer((N, N), "float32"), B: T.Buffer((N, N), "float32"), C: T.Buffer((N, N), "float32")):
    for i, j, k in T.grid(N, N, N):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]


def cuda_matmul(tx: int, ty: int, tk: int):
    """The matmul with a (tx, ty) thread block per output tile and the k loop unrolled by tk."""
    sch = tvm.s_tir.Schedule(matmul)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    io, ii = sch.split(i, [None, tx])
    jo, ji = sch.split(j, [None, ty])
    ko, ki = sch.split(k, [None, tk])
    sch.reorder(io, jo, ii, ji, ko, ki)
    sch.bind(io, "blockIdx.x")
    sch.bind(jo, "blockIdx.y")
    sch.bind(ii, "threadIdx.x")
    sch.bind(ji, "threadIdx.y")
    sch.unroll(ki)
    return sch.mod["main"]


def cpu_matmul(ti: int, tj: int, tk: int):
    """The matmul tiled (ti, tj), parallel over row tiles, vectorized along j, k unrolled by tk."""
    sch = tvm.s_tir.Schedule(matmul)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    io, ii = sch.split(i, [None, ti])
    jo, ji = sch.split(j, [None, tj])
    ko, ki = sch.split(k, [None, tk])
    sch.reorder(io, jo, ko, ii, ki, ji)
    sch.parallel(io)
    sch.vectorize(ji)
    sch.unroll(ki)
    return sch.mod["main"]


def variants(target):
    """The tuning sweep for `target`: 54 CUDA tile configs on GPUs, 18 CPU schedules otherwise."""
    if "gpu" in target.keys:
        return {f"matmul_{x}x{y}_k{k}": cuda_matmul(x, y, k) for x, y, k in CUDA_TILES}
    return {f"matmul_{i}x{j}_k{k}": cpu_matmul(i, j, k) for i, j, k in CPU_TILES}
