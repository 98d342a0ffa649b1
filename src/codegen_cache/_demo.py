"""The README's main job: lower a few kernels twice through a fresh cache, cold then warm."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ._cache import CodegenCache
from ._lowering import lower_for_codegen

__all__ = ["run_demo"]


def _kernels():
    from . import _demo_kernels as k

    cuda = {"kind": "cuda", "arch": "sm_90"}
    return [
        ("vector add", k.vadd, "llvm", True),
        ("vector add", k.vadd, "c", False),
        ("vector add", k.vadd_gpu, cuda, False),
        ("tiled matmul", k.matmul_gpu, cuda, False),
    ]


def run_demo(directory: str | None = None, *, out=print) -> list[dict]:
    """Lower each demo kernel cold, then warm from a fresh cache object; print a table."""
    with tempfile.TemporaryDirectory(prefix="codegen-cache-demo-") as tmp:
        root = Path(directory or tmp)
        rows = []
        inputs = [(name, *lower_for_codegen(func, target), compiled) for name, func, target, compiled in _kernels()]
        cold = CodegenCache(root, write_behind=False)
        for name, mod, target, compiled in inputs:
            t0 = time.perf_counter()
            cold.lower(mod, target, compile_device=compiled)
            rows.append({"kernel": name, "target": target.kind.name, "mode": "compiled" if compiled else "source",
                         "cold_ms": (time.perf_counter() - t0) * 1e3})
        warm = CodegenCache(root)  # a new cache object: the hits come from disk, as in a new process
        for row, (_, mod, target, compiled) in zip(rows, inputs):
            t0 = time.perf_counter()
            _, outcome = warm.lower_with_outcome(mod, target, compile_device=compiled)
            row["warm_ms"] = (time.perf_counter() - t0) * 1e3
            row["tier"] = outcome.tier
        out(f"{'kernel':<14}{'target':<8}{'mode':<10}{'cold ms':>10}{'warm ms':>10}{'speedup':>9}  tier")
        for r in rows:
            out(f"{r['kernel']:<14}{r['target']:<8}{r['mode']:<10}{r['cold_ms']:>10.2f}{r['warm_ms']:>10.3f}"
                f"{r['cold_ms'] / r['warm_ms']:>8.0f}x  {r['tier']}")
        return rows
