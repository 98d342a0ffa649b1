"""The README's main job: an autotuning-style sweep lowered twice through one cache directory.

Sweeps: the 54 tile configs of a CUDA matmul as source (what a tuner generates), a subset of
them compiled with nvcc where nvcc exists (on a host without a CUDA driver through
`precompile_cuda`, which fills the compiled store for GPU hosts), and 18 llvm matmul
schedules. The cold run uses a fresh cache object on an empty directory; the warm run a new
cache object on the same directory, so its hits come from disk as in a new process.

The directory is the demo's own (`demo_directory()`, beside the default cache), emptied at the
start of each run and left in place, so that the commands the demo prints at the end show
its entries and its numbers.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_NVCC_CONFIGS", "demo_directory", "run_demo"]

DEFAULT_NVCC_CONFIGS = 18
CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}


@dataclass
class _Sweep:
    name: str
    items: list[tuple[Any, Any, bool]]  # (codegen input, target, compile_device)
    cold: float = 0.0
    warm: float = 0.0
    codegen: float = 0.0  # the codegen's own time in the cold run (no key, no writing)
    cold_hits: int = 0
    warm_hits: int = 0
    notes: list[str] = field(default_factory=list)


def _spread(configs: tuple, n: int) -> list:
    """`n` configs spread evenly over the sweep (the first, then every len/n-th)."""
    n = max(0, min(n, len(configs)))
    return [configs[i * len(configs) // n] for i in range(n)]


def _sweeps(nvcc_configs: int) -> tuple[list[_Sweep], float, list[str]]:
    from . import _demo_kernels as k
    from .._build._prepare import prepare_for_codegen
    from .._compat import cuda_runtime_available
    from ..codegens.cuda import find_nvcc, nvcc_version

    t0 = time.perf_counter()
    cuda = {cfg: prepare_for_codegen(k.cuda_matmul(*cfg), CUDA_TARGET) for cfg in k.CUDA_TILES}
    cpu = [prepare_for_codegen(k.cpu_matmul(*cfg), "llvm") for cfg in k.CPU_TILES]
    lowering = time.perf_counter() - t0
    notes = []
    sweeps = [_Sweep(f"cuda matmul, source ({len(cuda)} configs)", [(m, t, False) for m, t in cuda.values()])]
    if find_nvcc() is None:
        notes.append("nvcc not found: the compiled CUDA sweep is skipped "
                     "(pip install 'tvm-codegen-cache[cuda]' brings nvcc).")
    elif nvcc_configs > 0:
        chosen = _spread(k.CUDA_TILES, nvcc_configs)
        sweeps.append(_Sweep(f"cuda matmul, nvcc {CUDA_TARGET['arch']}", [(*cuda[cfg], True) for cfg in chosen]))
        if len(chosen) < len(cuda):
            notes.append(f"nvcc compiles {len(chosen)} of the {len(cuda)} configs (spread over the sweep) to keep "
                         f"the demo short; --nvcc-configs {len(cuda)} compiles all.")
        if not cuda_runtime_available():
            notes.append("No CUDA driver here: nvcc builds the binaries without loading them "
                         "(precompile_cuda), filling compiled/ for GPU hosts; a warm hit is the entry found "
                         f"there, not loaded. nvcc: {nvcc_version()}.")
    sweeps.append(_Sweep(f"llvm matmul ({len(cpu)} schedules)", [(m, t, True) for m, t in cpu]))
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        notes.append("No C compiler (cc/gcc): llvm modules cannot be stored (they are kept as shared "
                     "libraries), so the llvm sweep misses in the warm run too.")
    return sweeps, lowering, notes


def _run(cache, sweeps: list[_Sweep], phase: str, progress: bool | None) -> None:
    from tqdm import tqdm

    from ._warm import warm_lowered

    total = sum(len(s.items) for s in sweeps)
    with tqdm(total=total, desc=phase, unit="kernel", disable=None if progress is None else not progress,
              file=sys.stderr, leave=False) as bar:
        for sweep in sweeps:
            for mod, target, compile_device in sweep.items:
                t0 = time.perf_counter()
                result = warm_lowered(cache, mod, target, compile_device)
                seconds = time.perf_counter() - t0
                hit = result["status"] == "hit"
                if phase == "cold":
                    sweep.cold += seconds
                    sweep.codegen += result["codegen_seconds"]
                    sweep.cold_hits += hit
                else:
                    sweep.warm += seconds
                    sweep.warm_hits += hit
                bar.update()


def _table(sweeps: list[_Sweep]) -> list[str]:
    rows = [(s.name, len(s.items), s.codegen, s.cold, s.warm, s.warm_hits) for s in sweeps]
    rows.append(("total", *(sum(r[i] for r in rows) for i in range(1, 6))))
    width = max(len(r[0]) for r in rows) + 2
    lines = [f"{'sweep':<{width}}{'kernels':>8}{'codegen s':>11}{'cold s':>9}{'warm s':>9}{'warm hits':>11}"
             f"{'speedup':>9}"]
    for name, n, codegen, cold, warm, hits in rows:
        speedup = f"{cold / warm:.0f}x" if warm > 0 else "-"
        if name == "total":
            lines.append("-" * len(lines[0]))
        lines.append(f"{name:<{width}}{n:>8}{codegen:>11.3f}{cold:>9.3f}{warm:>9.3f}{f'{hits}/{n}':>11}{speedup:>9}")
    return lines


def demo_directory() -> Path:
    """Where the demo keeps its cache unless told otherwise: beside the default cache, `<it>-demo`."""
    from .._config import default_directory

    default = default_directory()
    return default.with_name(default.name + "-demo")


def run_demo(directory: str | Path | None = None, *, nvcc_configs: int = DEFAULT_NVCC_CONFIGS,
             progress: bool | None = None, out: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run the sweeps cold, then warm from a new cache object; print a table, return the figures.

    `directory` (default: demo_directory()) is emptied of entries and counts first. Settings
    from the environment are not used: the demo shows the cache, not this host's configuration.
    """
    from .._cache._cache import CodegenCache
    from .._config import Settings

    emit = out or (lambda line: None)
    root = Path(directory) if directory is not None else demo_directory()
    sweeps, lowering, notes = _sweeps(nvcc_configs)
    emit("codegen-cache demo: an autotuning-style sweep, lowered cold and then warm through one cache")
    emit(f"  cache directory: {root} (the demo's own: emptied first, kept afterwards)")
    emit(f"  TVM's TIR pipeline lowered the {sum(len(s.items) for s in sweeps)} kernels once beforehand "
         f"in {lowering:.2f} s (lowering is not cached; the codegen after it is)")
    # Every entry stored (min_codegen_time=0): the demo shows the disk tier, also for kernels whose
    # codegen is cheaper than a disk hit (which a lowering would keep in memory only).
    cold_cache = CodegenCache(settings=Settings(directory=root, min_codegen_time=0), write_behind=False)
    cold_cache.clear()
    cold_cache.reset_stats()
    t0 = time.perf_counter()
    _run(cold_cache, sweeps, "cold", progress)
    cold_wall = time.perf_counter() - t0
    cold_cache.close()
    # A new object: nothing in its memory tier, so every hit comes from disk, as in a new process.
    warm_cache = CodegenCache(settings=Settings(directory=root, min_codegen_time=0), write_behind=False)
    t0 = time.perf_counter()
    _run(warm_cache, sweeps, "warm", progress)
    warm_wall = time.perf_counter() - t0
    stats = warm_cache.stats()
    warm_cache.close()
    emit("")
    for line in _table(sweeps):
        emit(line)
    emit("")
    emit("codegen: the codegen's (or nvcc's) own time in the cold run.")
    emit("cold: wall time on an empty directory: key, codegen, and writing each entry.")
    emit("warm: wall time of a new cache object on the same directory: key, read and decode from disk.")
    for s in sweeps:
        if s.warm > s.codegen > 0:
            emit(f"{s.name}: the codegen alone ({s.codegen * 1e3 / len(s.items):.2f} ms a kernel) is cheaper "
                 f"than a disk hit ({s.warm * 1e3 / len(s.items):.2f} ms); caching it pays only inside a "
                 "process (memory tier) or as the input of a slower step.")
    for note in notes:
        emit(note)
    where = shlex.quote(str(root))
    emit("")
    emit("Next: the demo's cache from the shell (docs/cli.md):")
    emit(f"  codegen-cache --dir {where} stats -v     # these hits and misses, per codegen and mode")
    emit(f"  codegen-cache --dir {where} ls           # its entries")
    emit("Your own TVM compiles: codegen_cache.enable(), or CODEGEN_CACHE_ENABLE=1 (docs/tvm.md).")
    return {
        "directory": str(root),
        "lowering_seconds": lowering,
        "cold_seconds": cold_wall,
        "warm_seconds": warm_wall,
        "sweeps": [
            {"name": s.name, "kernels": len(s.items), "codegen_seconds": s.codegen,
             "cold_seconds": s.cold, "warm_seconds": s.warm,
             "cold_hits": s.cold_hits, "warm_hits": s.warm_hits,
             "speedup": s.cold / s.warm if s.warm > 0 else None}
            for s in sweeps
        ],
        "stats": stats.as_dict(),
        "notes": notes,
    }
