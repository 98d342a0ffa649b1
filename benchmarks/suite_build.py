"""codegen_cache.build against tvm.tirx.build, side by side in one process (timing.interleave).

For a 1024-element vector add built for llvm and for CUDA (sm_90; without a CUDA driver TVM
makes source-only CUDA): tvm.tirx.build; a cold codegen_cache.build (its entries and index
cleared before each call, untimed; the store on the caller's thread, write_behind=False); a warm
build from the memory tier (the same PrimFunc object, and a new but structurally equal one: a
re-run notebook cell); a warm build from disk (a cache object with no memory tier: the index and
the entries read and loaded, nothing lowered); and the first build through a new CodegenCache
object on a filled directory (it opens its stores).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from timing import interleave, row

ROUNDS = 5
CUDA = {"kind": "cuda", "arch": "sm_90"}
DESCRIPTION = (
    "`codegen_cache.build` (a cached `tvm.tirx.build`) of a 1024-element vector add for llvm and for CUDA "
    "(source-only without a driver), interleaved in one process: cold (entries cleared before each call, stored "
    "before it returns), warm from memory (the same PrimFunc, and an equal new one: a re-run notebook cell), warm "
    "from disk (a cache object with no memory tier), and the first build through a new cache object. **Floor**: "
    "`tvm.tirx.build` of the same kernel in the same rounds. No goal: the rows show what a notebook re-run and a "
    "new process's build cost against TVM's own.")


def _equal_copy(func):
    """A new PrimFunc object, structurally equal (what re-running a cell that defines it gives)."""
    return func.with_attr("global_symbol", func.attrs["global_symbol"])


def _variants(root: Path, func, target, caches: list) -> dict:
    import tvm

    import codegen_cache as cc

    count = iter(range(1 << 30))

    def cache(directory: Path, **options):
        made = cc.CodegenCache(directory, min_codegen_time=0, **options)
        caches.append(made)
        return made

    def built(c, f=func):
        with cc.use_cache(c):
            cc.build(f, target)

    cold = cache(root / f"cold-{next(count)}", write_behind=False)
    built(cold)
    memory = cache(root / f"mem-{next(count)}")
    built(memory)
    state = {"func": func}
    directory = root / f"disk-{next(count)}"
    built(cache(directory, write_behind=False))
    disk = cache(directory, memory_entries=0)
    built(disk)
    fresh: dict = {}

    def clear():
        cold.clear()
        cold.store("index").clear()

    return {
        "tvm.tirx.build": lambda: tvm.tirx.build(func, target),
        "cold": (lambda: built(cold), clear),
        "warm, memory (same PrimFunc)": lambda: built(memory),
        "warm, memory (an equal PrimFunc)": (lambda: built(memory, state["func"]),
                                             lambda: state.update(func=_equal_copy(func))),
        "warm, disk (no memory tier)": lambda: built(disk),
        "first build of a new cache object": (lambda: built(fresh["cache"]),
                                              lambda: fresh.update(cache=cache(directory))),
    }


def run(rounds: int) -> list[dict]:
    """Each variant's median against tvm.tirx.build's, per target, as rows."""
    import kernels as K

    rows = []
    caches: list = []
    with tempfile.TemporaryDirectory(prefix="bench-build-", ignore_cleanup_errors=True) as tmp:
        try:
            for label, target, gpu in (("llvm", "llvm", False), ("cuda", CUDA, True)):
                times = interleave(_variants(Path(tmp) / label, K.vadd(gpu), target, caches), 6 * rounds + 1)
                floor = statistics.median(times.pop("tvm.tirx.build"))
                rows.append(row(f"tvm.tirx.build: vadd / {label}", floor))
                for name, samples in times.items():
                    median = statistics.median(samples)
                    rows.append(row(f"codegen_cache.build, {name}: vadd / {label}", median, floor=floor,
                                    note=f"{floor / median:.0f}x faster than tvm.tirx.build" if median < floor
                                    else f"{median / floor:.2f}x tvm.tirx.build"))
        finally:
            for c in caches:
                c.close()
    return rows
