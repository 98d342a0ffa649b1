"""tilelang.compile served by codegen_cache.tilelang vs by tilelang's own KernelCache, side by side.

Each measurement is a fresh Python process that imports tilelang (and codegen_cache), builds the
kernel function, then times `tilelang.compile(func, target=sm_80)` + `kernel.get_kernel_source()`
(imports and the function's construction are excluded, as the issue asks). Runs of the two modes
are interleaved, each mode with its own directories:

- `kernelcache`: tilelang alone (its KernelCache in TILELANG_CACHE_DIR);
- `codegen-cache`: codegen_cache.tilelang.enable() (CODEGEN_CACHE_DIR; tilelang's cache then
  stores nothing).

The first run of each mode is the cold compile; the rest are fresh-process hits.

    python benchmarks/bench_tilelang.py [--runs 7] [--kernels vadd,gemm] [--json out.json] [--breakdown]

--breakdown also times the steps of a hit (tilelang's own `_build_kernel`, which both modes call,
and codegen-cache's key, read, context, private copy and enable()) with perf_counter wrappers.

Needs tilelang (an environment made as docs/tilelang.md says); no GPU (nvcc compiles for sm_80).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
mode, kernel = sys.argv[1], sys.argv[2]
import tilelang
sys.path.insert(0, sys.argv[3])
import tl_kernels
setup = 0.0
spans = {}
if len(sys.argv) > 4:  # --breakdown: wall time of the hit's steps (a wrapper adds ~1 us per step)
    import functools, importlib
    def span(module, name, label):
        owner = importlib.import_module(module)
        if "." in name:  # a method: Class.name
            klass, name = name.split(".")
            owner = getattr(owner, klass)
        inner = getattr(owner, name)
        @functools.wraps(inner)
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                spans[label] = spans.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, timed)
    # What both modes pay on a hit: tilelang rebuilds the kernel from its library (JITKernel.from_database).
    span("tilelang.cache.kernel_cache", "KernelCache._build_kernel", "hit: tilelang's _build_kernel (both modes)")
if mode == "codegen-cache":
    import codegen_cache.tilelang
    if len(sys.argv) > 4:
        span("codegen_cache._cache._cache", "_default_cache", "enable: the default CodegenCache")
        span("codegen_cache.tilelang._device", "prepare", "enable: prepare (callbacks + cache)")
        span("codegen_cache.tilelang._frontend", "frontend_key", "hit: frontend key")
        span("codegen_cache.tilelang._frontend", "_read_entry", "hit: read + checksum the entry")
        span("codegen_cache.tilelang._frontend", "_stored_dispatch", "hit: backend context from the entry")
        span("codegen_cache.tilelang._frontend", "private_file", "hit: private copy of the library")
        span("codegen_cache.tilelang._frontend", "_load", "hit: _load (all of the above but the key)")
        from codegen_cache import _context
        _context.set_default_factory(importlib.import_module("codegen_cache._cache._cache")._default_cache)
    t0 = time.perf_counter()
    codegen_cache.tilelang.enable()  # per-process setup, reported separately (enable_s)
    setup = time.perf_counter() - t0
func = getattr(tl_kernels, kernel)()
start = time.perf_counter()
compiled = tilelang.compile(func, target={"kind": "cuda", "arch": "sm_80"})
source = compiled.get_kernel_source()
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "enable_s": setup, "source_len": len(source), "source": source, "spans": spans}))
"""

KERNELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "with_tilelang")


def child(mode: str, kernel: str, dirs: dict[str, str], breakdown: bool = False) -> dict:
    env = {**os.environ, "TILELANG_CACHE_DIR": dirs["tilelang"], "CODEGEN_CACHE_DIR": dirs["codegen"],
           "TILELANG_PRINT_ON_COMPILATION": "0"}
    done = subprocess.run([sys.executable, "-c", CHILD, mode, kernel, KERNELS_DIR, *(["breakdown"] if breakdown else [])], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} {kernel} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh-process hits per mode and kernel")
    parser.add_argument("--kernels", default="vadd,gemm")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--breakdown", action="store_true",
                        help="time the steps of codegen-cache's hit and enable() too (medians per step)")
    args = parser.parse_args(argv)
    modes = ("kernelcache", "codegen-cache")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-tilelang-") as root:
        for kernel in args.kernels.split(","):
            dirs = {m: {"tilelang": os.path.join(root, kernel, m, "tl"), "codegen": os.path.join(root, kernel, m, "cc")}
                    for m in modes}
            cold = {m: child(m, kernel, dirs[m]) for m in modes}
            if cold["kernelcache"]["source"] != cold["codegen-cache"]["source"]:
                raise SystemExit(f"{kernel}: the two modes compiled different sources")
            hits = {m: [] for m in modes}
            setups = []
            steps: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
            for _ in range(args.runs):
                for m in modes:  # interleaved: both modes see the same machine load
                    run = child(m, kernel, dirs[m], args.breakdown)
                    if run["source"] != cold[m]["source"]:
                        raise SystemExit(f"{kernel}: a {m} hit returned another source")
                    hits[m].append(run["seconds"])
                    for label, value in run.get("spans", {}).items():
                        steps[m].setdefault(label, []).append(value)
                    if m == "codegen-cache":
                        setups.append(run["enable_s"] + run["seconds"])
            row = {m: {"cold_s": cold[m]["seconds"], "hit_median_s": statistics.median(hits[m]), "hits_s": hits[m]}
                   for m in modes}
            row["ratio_hit"] = row["codegen-cache"]["hit_median_s"] / row["kernelcache"]["hit_median_s"]
            row["codegen-cache"]["enable_plus_hit_median_s"] = statistics.median(setups)
            row["ratio_enable_plus_hit"] = statistics.median(setups) / row["kernelcache"]["hit_median_s"]
            for m in modes:
                row[m]["steps_median_s"] = {k: statistics.median(v) for k, v in steps[m].items()}
            results[kernel] = row
            print(f"{kernel:6s} cold  kernelcache {row['kernelcache']['cold_s']:.3f} s   codegen-cache "
                  f"{row['codegen-cache']['cold_s']:.3f} s")
            print(f"{kernel:6s} hit   kernelcache {row['kernelcache']['hit_median_s'] * 1e3:.2f} ms   codegen-cache "
                  f"{row['codegen-cache']['hit_median_s'] * 1e3:.2f} ms   ratio {row['ratio_hit']:.2f} "
                  f"(median of {args.runs} fresh processes each)")
            print(f"{kernel:6s} hit with enable() timed too: codegen-cache "
                  f"{row['codegen-cache']['enable_plus_hit_median_s'] * 1e3:.2f} ms   ratio {row['ratio_enable_plus_hit']:.2f}")
            for m in modes:
                for label, value in row[m]["steps_median_s"].items():
                    print(f"{kernel:6s}   {m:13s} {label:45s} {value * 1e3:.3f} ms (median)")
    results["_meta"] = {"date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0],
                        "argv": sys.argv, "runs": args.runs}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return results


if __name__ == "__main__":
    from timing import compile_bytecode

    compile_bytecode()
    main()
