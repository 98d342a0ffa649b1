"""tilelang.compile served by codegen_cache.tilelang against tilelang's own KernelCache, in fresh processes.

Each measurement is a fresh Python process that imports tilelang (and codegen_cache), builds the
kernel function (tests/with_tilelang/tl_kernels.py), then times `tilelang.compile(func,
target=sm_80)` + `kernel.get_kernel_source()`. Two modes, each with its own directories:
`kernelcache` (tilelang alone, its KernelCache in TILELANG_CACHE_DIR) and `codegen-cache`
(codegen_cache.tilelang.enable(), timed apart and added to the hit for the goal; tilelang's own
cache then stores nothing). The first run of each mode is the cold compile; then hits, the two
modes one of each per round (timing.fresh_rounds). Needs tilelang (an environment made as
docs/tilelang.md says); no GPU (nvcc compiles for sm_80).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import tempfile
from pathlib import Path

from timing import child_env, fresh_rounds, paired, row, run_child

ROUNDS = 7
KERNELS_DIR = str(Path(__file__).resolve().parent.parent / "tests" / "with_tilelang")
DESCRIPTION = (
    "`tilelang.compile` + `get_kernel_source()` of a vector add and a 256³ fp16 GEMM for sm_80, in fresh processes: "
    "served by `codegen_cache.tilelang.enable()` against tilelang's own KernelCache, each with its own directories, "
    "interleaved. **Floor**: KernelCache's fresh-process hit. **Goal**: a fresh process's hit, `enable()` counted "
    "in, <= 0.5x KernelCache's hit. Runs only where tilelang is installed (its own environment: docs/tilelang.md).")

CHILD = r"""
import json, sys, time
mode, kernel, kernels_dir = sys.argv[1], sys.argv[2], sys.argv[3]
import tilelang
sys.path.insert(0, kernels_dir)
import tl_kernels
setup = 0.0
if mode == "codegen-cache":
    import codegen_cache.tilelang
    t0 = time.perf_counter()
    codegen_cache.tilelang.enable()
    setup = time.perf_counter() - t0
func = getattr(tl_kernels, kernel)()
start = time.perf_counter()
compiled = tilelang.compile(func, target={"kind": "cuda", "arch": "sm_80"})
source = compiled.get_kernel_source()
print(json.dumps({"seconds": time.perf_counter() - start, "enable": setup, "source": source}))
"""


def run(rounds: int) -> list[dict]:
    """Cold compiles and fresh-process hits of both modes per kernel, as rows."""
    if importlib.util.find_spec("tilelang") is None:
        return [row("tilelang", None, note="skipped: tilelang is not installed in this environment")]
    modes = ("kernelcache", "codegen-cache")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-tilelang-") as root:
        for kernel in ("vadd",) if rounds <= 2 else ("vadd", "gemm"):
            env = {m: child_env(TILELANG_CACHE_DIR=os.path.join(root, kernel, m, "tl"),
                                CODEGEN_CACHE_DIR=os.path.join(root, kernel, m, "cc"),
                                TILELANG_PRINT_ON_COMPILATION="0") for m in modes}
            args = {m: (CHILD, [m, kernel, KERNELS_DIR], env[m]) for m in modes}
            cold = {m: run_child(*args[m]) for m in modes}
            if cold["kernelcache"]["source"] != cold["codegen-cache"]["source"]:
                raise RuntimeError(f"{kernel}: the two modes compiled different sources")
            s = fresh_rounds(args, rounds)
            if any(x["source"] != cold[m]["source"] for m in modes for x in s[m]):
                raise RuntimeError(f"{kernel}: a hit returned another source")
            theirs = [x["seconds"] for x in s["kernelcache"]]
            ours = [x["seconds"] + x["enable"] for x in s["codegen-cache"]]
            ratio, noise = paired(ours, theirs)
            rows.append(row(f"fresh-process hit, enable() counted in: {kernel}", statistics.median(ours),
                            floor=statistics.median(theirs), ratio=ratio, goal="<= 0.5x KernelCache's hit",
                            ok=ratio <= 0.5, note=f"median of per-round ratios, noise +-{noise:.2f}; enable() "
                            f"{statistics.median(x['enable'] for x in s['codegen-cache']) * 1e3:.2f} ms"))
            rows.append(row(f"cold compile through the cache: {kernel}", cold["codegen-cache"]["seconds"],
                            floor=cold["kernelcache"]["seconds"], note="floor: KernelCache's cold compile; one each"))
    return rows
