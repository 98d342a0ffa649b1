"""The stored form of an llvm module: its LLVM IR text, by inspect_source("ll") or printed into a memfd.

A stored llvm miss writes the module's LLVM IR text before lower() returns (its staged file), so
this is on the caller's path of every stored llvm miss. Both routes give the same bytes (checked
here); rounds interleave them, medians of fresh builds' modules.

    python benchmarks/bench_ir_text.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import tvm

import codegen_cache as cc
import kernels
from codegen_cache._artifacts import _llvm


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    out = {}
    build = tvm.get_global_func("target.build.llvm")
    for name in ("vadd", "matmul", "2048 stmts", "64 funcs"):
        mod, target = cc.prepare_for_codegen(kernels.kernel(name, False), tvm.target.Target("llvm"))
        module = build(mod, target)
        text = module.inspect_source("ll").encode()
        if _llvm.ir_text(module) != text:
            raise SystemExit(f"{name}: the memfd route gave other bytes")
        times: dict[str, list[float]] = {"inspect_source": [], "memfd": []}
        routes = {"inspect_source": lambda: module.inspect_source("ll").encode(), "memfd": lambda: _llvm.ir_text(module)}
        for i in range(args.rounds):
            for label in (("inspect_source", "memfd") if i % 2 else ("memfd", "inspect_source")):
                t0 = time.perf_counter()
                routes[label]()
                times[label].append(time.perf_counter() - t0)
        a, b = (statistics.median(times[k]) for k in ("inspect_source", "memfd"))
        out[name] = {"bytes": len(text), "inspect_source_s": a, "memfd_s": b}
        print(f"{name:10s} {len(text):>9,d} bytes   inspect_source + encode {a * 1e3:7.3f} ms   memfd {b * 1e3:7.3f} ms"
              f"   {b / a:.2f}x")
    return out


if __name__ == "__main__":
    main()
