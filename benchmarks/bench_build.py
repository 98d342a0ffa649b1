"""codegen_cache.build against tvm.tirx.build, side by side in one run.

    python benchmarks/bench_build.py [--reps 30] [--nvcc-reps 3] [--no-stub] [--json out.json]
    python benchmarks/bench_build.py --notebook 20

Variants run interleaved (one of each per round, order shuffled), so a slow spell on a shared
machine hits all of them alike; medians and ratios of medians are printed.

- llvm vector add: tvm.tirx.build; a cold cached build (new cache); a warm build from the
  memory tier (same PrimFunc object, and a new but equal one: a re-run notebook cell); a warm
  build in a new CodegenCache on the same directory (memory empty: index + disk entries,
  no lowering) — the warm path of a new process, without the interpreter start.
- CUDA vector add, sm_90: on a host without a CUDA driver, tvm.tirx.build returns source-only
  CUDA, so the compiled cold cost is measured in parts: tvm.tirx.build (lowering + source) plus
  the nvcc compile (codegens.cuda.compile_cuda_payload, what precompile_cuda runs).
- With --stub (default where gcc, libcudart and nvcc exist): a child process with a stub
  libcuda.so.1 (tests/cuda_stub.py), so TVM's CUDA runtime loads and the compiled path runs end
  to end: tvm.tirx.build with TVM_CUDA_COMPILE_MODE=nvcc against codegen_cache.build cold and
  warm. Nothing is launched, and TVM loads CUDA modules into the driver lazily, so the real
  driver's cuModuleLoadData (paid by both at first launch) is not in these numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
import tvm.s_tir  # noqa: E402,F401
from timing import compile_bytecode, fmt_ratio, fmt_time, interleave, summary  # noqa: E402
from tvm.target import Target  # noqa: E402

import codegen_cache as cc
from codegen_cache import _compat  # noqa: E402
from codegen_cache.codegens import cuda as cuda_codegen  # noqa: E402

from kernels import vadd, vadd_gpu  # noqa: E402  tests/kernels.py: the kernels the tests lower

CUDA = {"kind": "cuda", "arch": "sm_90"}


def _equal_copy(func):
    """A new PrimFunc object, structurally equal (what re-running a cell that defines it gives)."""
    return func.with_attr("global_symbol", func.attrs["global_symbol"])


class Variants:
    """Builders of the timed callables; each cache lives in its own temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = 0
        self.caches: list[cc.CodegenCache] = []

    def new_dir(self) -> Path:
        self.count += 1
        return self.root / f"c{self.count}"

    def cache(self, directory: Path, **options) -> cc.CodegenCache:
        cache = cc.CodegenCache(directory, **options)
        self.caches.append(cache)
        return cache

    def cold(self, func, target):
        """A kernel this cache has no entry for: its entries and index are cleared before each run."""
        cache = self.cache(self.new_dir(), write_behind=False)  # the store is part of the cost
        with cc.use_cache(cache):
            cc.build(func, target)  # opens the stores: a cache in use, not a new directory

        def pre():
            cache.clear()
            cache.store("index").clear()

        def run():
            with cc.use_cache(cache):
                cc.build(func, target)

        return run, pre

    def warm_memory(self, func, target, *, equal_copy: bool):
        """A build this process did before: one memory hit."""
        cache = self.cache(self.new_dir())
        with cc.use_cache(cache):
            cc.build(func, target)
        state = {"func": func}

        def pre():
            if equal_copy:
                state["func"] = _equal_copy(func)

        def run():
            with cc.use_cache(cache):
                cc.build(state["func"], target)

        return run, pre

    def warm_disk(self, func, target):
        """A build another process did: no memory tier, so index + entries are read and decoded."""
        directory = self.new_dir()
        with cc.use_cache(self.cache(directory, write_behind=False)):
            cc.build(func, target)
        cache = self.cache(directory, memory_entries=0)
        with cc.use_cache(cache):
            cc.build(func, target)  # opens the stores once, as the first build of a process does

        def run():
            with cc.use_cache(cache):
                cc.build(func, target)

        return run

    def first_in_new_cache(self, func, target):
        """The first build through a new CodegenCache on a filled directory (opens its stores)."""
        directory = self.new_dir()
        with cc.use_cache(self.cache(directory, write_behind=False)):
            cc.build(func, target)
        state = {}

        def pre():
            state["cache"] = self.cache(directory)

        def run():
            with cc.use_cache(state["cache"]):
                cc.build(func, target)

        return run, pre

    def close(self) -> None:
        for cache in self.caches:
            cache.close()


def _check_llvm(root: Path) -> None:
    """The cached module must compute exactly what tvm.tirx.build's does, before any timing."""
    a = np.random.default_rng(0).random(1024, dtype="float32")

    def run(module):
        out = tvm.runtime.tensor(np.zeros(1024, "float32"))
        module["vadd"](tvm.runtime.tensor(a), tvm.runtime.tensor(a), out)
        return out.numpy()

    with cc.use_cache(cc.CodegenCache(root / "check", write_behind=False)):
        cold = cc.build(vadd, "llvm")
    with cc.use_cache(cc.CodegenCache(root / "check")):
        warm = cc.build(vadd, "llvm")
    reference = run(tvm.tirx.build(vadd, "llvm"))
    assert np.array_equal(run(cold), reference) and np.array_equal(run(warm), reference)


def _table(title: str, results: dict[str, list[float]], baseline: str, extra: dict[str, float] | None = None):
    print(f"\n{title}")
    print(f"  {'variant':<58} {'median':>9} {'p90':>9} {'n':>4} {'speedup':>9}")
    medians = {name: summary(xs)["median"] for name, xs in results.items()}
    medians.update(extra or {})
    base = medians[baseline]
    for name, median in medians.items():
        xs = results.get(name, [])
        p90 = summary(xs)["p90"] if xs else float("nan")
        print(f"  {name:<58} {fmt_time(median):>9} {fmt_time(p90):>9} {len(xs) or '-':>4} {fmt_ratio(base / median):>9}")
    return medians


def host_benchmarks(reps: int, nvcc_reps: int) -> dict[str, dict[str, float]]:
    """Both tables of this process (llvm; CUDA without a driver)."""
    root = Path(tempfile.mkdtemp(prefix="bench_build_"))
    variants = Variants(root)
    out = {}
    try:
        _check_llvm(root)
        llvm = interleave({
            "tvm.tirx.build": lambda: tvm.tirx.build(vadd, "llvm"),
            "build, cold (no entry; store included)": variants.cold(vadd, "llvm"),
            "build, warm: memory (same PrimFunc)": variants.warm_memory(vadd, "llvm", equal_copy=False),
            "build, warm: memory (new, equal PrimFunc)": variants.warm_memory(vadd, "llvm", equal_copy=True),
            "build, warm: from disk (index + entries, no memory tier)": variants.warm_disk(vadd, "llvm"),
            "build, warm: first build of a new CodegenCache object": variants.first_in_new_cache(vadd, "llvm"),
        }, reps)
        out["llvm"] = _table("llvm vector add (goal: warm >= 40x tvm.tirx.build)", llvm, "tvm.tirx.build")

        target = Target(CUDA)
        device_mod, device_target = cc.prepare_for_codegen(vadd_gpu, target)
        nvcc = interleave({"nvcc compile (compile_cuda_payload)":
                           lambda: cuda_codegen.compile_cuda_payload(device_mod, device_target)}, nvcc_reps)
        gpu = interleave({
            "tvm.tirx.build (source-only CUDA: no driver here)": lambda: tvm.tirx.build(vadd_gpu, target),
            "build, cold (no entry; source-only CUDA)": variants.cold(vadd_gpu, target),
            "build, warm: memory (same PrimFunc)": variants.warm_memory(vadd_gpu, target, equal_copy=False),
            "build, warm: memory (new, equal PrimFunc)": variants.warm_memory(vadd_gpu, target, equal_copy=True),
            "build, warm: from disk (index + entries, no memory tier)": variants.warm_disk(vadd_gpu, target),
            "build, warm: first build of a new CodegenCache object": variants.first_in_new_cache(vadd_gpu, target),
        }, reps)
        nvcc_median = summary(nvcc["nvcc compile (compile_cuda_payload)"])["median"]
        source_median = summary(gpu["tvm.tirx.build (source-only CUDA: no driver here)"])["median"]
        gpu["nvcc compile (compile_cuda_payload)"] = nvcc["nvcc compile (compile_cuda_payload)"]
        cold_name = "cold compiled = tvm.tirx.build (source) + nvcc compile"
        out["cuda"] = _table("CUDA vector add, sm_90 (goal: warm >= 1000x the nvcc-compiled cold build)", gpu,
                             cold_name, {cold_name: source_median + nvcc_median})
    finally:
        variants.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


def _within(target, func, *args):
    with target:
        return func(*args)


def stub_child(reps: int, nvcc_reps: int) -> None:
    """Runs under a stub libcuda.so.1: the compiled CUDA path end to end (nothing launched)."""
    assert _compat.cuda_runtime_available(), "the stub driver did not load TVM's CUDA runtime"
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"  # tvm.tirx.build: nvcc, as our compiled codegen
    root = Path(tempfile.mkdtemp(prefix="bench_build_stub_"))
    variants = Variants(root)
    target = Target(CUDA)
    try:
        slow = interleave({
            # TVM reads the arch from Target.current() (no device to query here).
            "tvm.tirx.build (nvcc, compiled)": lambda: _within(target, tvm.tirx.build, vadd_gpu, target),
            "build, cold (no entry; nvcc, compiled)": variants.cold(vadd_gpu, target),
        }, nvcc_reps)
        fast = interleave({
            "build, warm: memory (same PrimFunc)": variants.warm_memory(vadd_gpu, target, equal_copy=False),
            "build, warm: memory (new, equal PrimFunc)": variants.warm_memory(vadd_gpu, target, equal_copy=True),
            "build, warm: from disk (index + entries, no memory tier)": variants.warm_disk(vadd_gpu, target),
            "build, warm: first build of a new CodegenCache object": variants.first_in_new_cache(vadd_gpu, target),
        }, reps)
        medians = _table("CUDA vector add, sm_90, compiled, stub driver (goal: warm >= 1000x)",
                         {**slow, **fast}, "tvm.tirx.build (nvcc, compiled)")
        print("STUB_JSON " + json.dumps(medians))
    finally:
        variants.close()
        shutil.rmtree(root, ignore_errors=True)


def stub_benchmarks(reps: int, nvcc_reps: int) -> dict[str, float] | None:
    """Re-run this script under a stub CUDA driver; None where one cannot be built."""
    from cuda_stub import build_stub

    if cuda_codegen.find_nvcc() is None:
        print("\n(no nvcc: compiled CUDA not measured)")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        stub = build_stub(Path(tmp))
        if stub is None:
            print("\n(no gcc or libcudart.so.13: the stub CUDA driver cannot be built; compiled CUDA not measured)")
            return None
        env = {**os.environ, "LD_LIBRARY_PATH": f"{stub}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
        cmd = [sys.executable, __file__, "--stub-child", "--reps", str(reps), "--nvcc-reps", str(nvcc_reps)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        print("\nstub run failed:\n" + done.stderr[-3000:])
        return None
    lines = done.stdout.splitlines()
    print("\n".join(line for line in lines if not line.startswith("STUB_JSON ")))
    return json.loads(next(line for line in lines if line.startswith("STUB_JSON "))[len("STUB_JSON "):])


# A notebook cell that defines a kernel and builds it. IPython puts each cell's source in
# linecache under a made-up file name, which is how TVMScript's parser finds it; so does this.
CELL = """
import tvm
from tvm.script import tirx as T
import codegen_cache as cc


@T.prim_func(s_tir=True)
def scale(A: T.Buffer((4096,), "float32"), B: T.Buffer((4096,), "float32")):
    for i in range(4096):
        with T.sblock("B"):
            vi = T.axis.spatial(4096, i)
            B[vi] = A[vi] * T.float32(2)


t0 = time.perf_counter()
rt = BUILD(scale, "llvm")
build_seconds = time.perf_counter() - t0
"""


def _run_cell(build, namespace: dict) -> tuple[float, float]:
    """Execute CELL once, as a re-run notebook cell does; (cell seconds, build seconds)."""
    import linecache

    name = "<ipython-input-cell>"
    linecache.cache[name] = (len(CELL), None, CELL.splitlines(True), name)
    namespace.update(BUILD=build, time=time)
    t0 = time.perf_counter()
    exec(compile(CELL, name, "exec"), namespace)  # noqa: S102  our own constant text
    return time.perf_counter() - t0, namespace["build_seconds"]


def notebook(runs: int) -> dict[str, float]:
    """Re-run a cell that defines and builds a kernel, with codegen_cache.build and without."""
    root = Path(tempfile.mkdtemp(prefix="bench_notebook_"))
    cache = cc.CodegenCache(root)
    tiers = []
    timings: dict[str, list[float]] = {"cell (tvm.tirx.build)": [], "build (tvm.tirx.build)": [],
                                       "cell (codegen_cache.build)": [], "build (codegen_cache.build)": []}
    try:
        with cc.use_cache(cache):
            first_cell, first_build = _run_cell(cc.build, {})
            for _ in range(runs):
                cell, build = _run_cell(tvm.tirx.build, {})
                timings["cell (tvm.tirx.build)"].append(cell)
                timings["build (tvm.tirx.build)"].append(build)
                cell, build = _run_cell(cc.build, {})
                timings["cell (codegen_cache.build)"].append(cell)
                timings["build (codegen_cache.build)"].append(build)
                tiers.append(cc.last_outcome().tier)
        stats = cache.stats(shared=False)
    finally:
        cache.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nnotebook: a cell that defines a 4096-element llvm kernel and builds it, re-run {runs} times")
    print(f"  first run with codegen_cache.build: cell {fmt_time(first_cell)}, build {fmt_time(first_build)}")
    medians = {name: summary(xs)["median"] for name, xs in timings.items()}
    for name, median in medians.items():
        print(f"  re-run, {name:<30} median {fmt_time(median):>9}  p90 {fmt_time(summary(timings[name])['p90']):>9}")
    print(f"  re-run tiers: {sorted(set(tiers))}; counters: {stats.hits_memory} memory hits, "
          f"{stats.codegen_runs} builds, {stats.misses} misses")
    print(f"  build speedup on re-run: {fmt_ratio(medians['build (tvm.tirx.build)'] / medians['build (codegen_cache.build)'])}")
    return medians


def main() -> None:
    """Run the benchmarks and print the tables (and write JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30, help="rounds of the fast variants")
    parser.add_argument("--nvcc-reps", type=int, default=3, help="rounds of the nvcc variants")
    parser.add_argument("--no-stub", action="store_true", help="skip the stub-driver run of compiled CUDA")
    parser.add_argument("--notebook", type=int, metavar="RUNS", default=0,
                        help="only the notebook measurement: re-run a kernel-building cell RUNS times")
    parser.add_argument("--stub-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the medians (seconds) to this file")
    args = parser.parse_args()
    if args.stub_child:
        stub_child(args.reps, args.nvcc_reps)
        return
    started = time.perf_counter()
    print(f"tvm {tvm.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    if args.notebook:
        notebook(args.notebook)
        return
    results: dict[str, object] = host_benchmarks(args.reps, args.nvcc_reps)
    if not args.no_stub:
        results["cuda_stub"] = stub_benchmarks(args.reps, args.nvcc_reps)
    print(f"\n({time.perf_counter() - started:.0f}s in all)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    compile_bytecode()
    main()
