"""What answering as the built llvm module costs: llvm hits, other modules' methods, exporting a hit.

    python benchmarks/bench_as_built.py [--repeat N]

Prints medians of interleaved rounds (µs unless marked): an llvm disk hit (memory tier off) and
memory hit of a vector add; `module.kind` and `module["f"]` on a module that is not the cache's,
and on a hit (the registry lookup in front of TVM's own method); export_library of a cold build
and of a disk hit (.so: the stored library; .tar: the object file written from the IR). Run it from a checkout without
the registry to compare hits before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import tvm  # noqa: E402

import codegen_cache as cc  # noqa: E402
import kernels  # noqa: E402


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cgc-bench-"))
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    writer = cc.CodegenCache(work / "cache", write_behind=False)
    writer.lower(mod, target)
    writer.flush(upgrades=True, timeout=300)
    disk = cc.CodegenCache(work / "cache", memory_entries=0)
    memory = cc.CodegenCache(work / "cache")
    hit = memory.lower(mod, target)
    other = tvm.tirx.build(kernels.vmul, "llvm")
    times: dict[str, list[float]] = {k: [] for k in ("disk hit", "memory hit", "kind (other)", "kind (hit)",
                                                     "get_function (other)", "get_function (hit)")}
    for _ in range(args.repeat):
        for name, call in (("disk hit", lambda: disk.lower(mod, target)), ("memory hit", lambda: memory.lower(mod, target)),
                           ("kind (other)", lambda: other.kind), ("kind (hit)", lambda: hit.kind),
                           ("get_function (other)", lambda: other["vmul"]), ("get_function (hit)", lambda: hit["vadd"])):
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    for name, samples in times.items():
        print(f"{name:24s} {_median_us(samples):9.1f} us")
    if not hasattr(cc._artifacts, "_as_built"):
        return  # a checkout without the registry exports no hit
    exports = {"export .so (cold build)": lambda p: tvm.tirx.build(kernels.vadd, "llvm").export_library(p),
               "export .so (disk hit)": lambda p: disk.lower(mod, target).export_library(p),
               "export .tar (disk hit)": lambda p: disk.lower(mod, target).export_library(p + ".tar")}
    for name, call in exports.items():
        samples = []
        for i in range(max(5, args.repeat // 20)):
            path = str(work / f"e{i}.so")
            t0 = time.perf_counter()
            call(path)
            samples.append(time.perf_counter() - t0)
            os.unlink(path) if os.path.exists(path) else None
        print(f"{name:24s} {statistics.median(samples) * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
