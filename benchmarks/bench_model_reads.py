"""What the model key's `registered` and `database` parts cost: the scan once per process, then per compile.

    python benchmarks/bench_model_reads.py [--processes 7] [--repeat 300]

Each of `--processes` fresh interpreters imports TVM and Relax, enables the switch and times:
the first registered part (the scan of every global function and operator attribute); the
scan again on every call, as where the registration wrappers are missing (the fallback); the
per-compile part afterwards with only TVM's own and the switch's routers registered, then with a
user's global function, FLegalize and named pipeline registered; the database part of a
MemoryDatabase of 4 real records, first (digest) and memoized. Medians over the processes of
each process's median; a warm Relax compile (a memory hit of the MLP) for scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent.parent / "tests")

PROCESS = textwrap.dedent("""
    import json, statistics, sys, tempfile, time
    sys.path.insert(0, {tests!r})
    import tvm
    from tvm import relax
    import codegen_cache as cc
    import model_reads, relax_models
    from codegen_cache._build import _reads

    repeat = {repeat}
    LLVM_ONLY = frozenset(["llvm"])

    def median_us(func, n=repeat):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            func()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    cache = cc.CodegenCache(tempfile.mkdtemp(), write_behind=False)
    cc.enable(cache, children=False)
    out = {{}}
    t0 = time.perf_counter()
    _reads.registered_part(LLVM_ONLY)
    out["first (scan)"] = (time.perf_counter() - t0) * 1e6

    def rescan():
        _reads._state["scanned"] = False
        _reads.registered_part(LLVM_ONLY)

    out["scan on every call (no wrappers)"] = median_us(rescan, 5)
    out["per compile, TVM's own + routers"] = median_us(lambda: _reads.registered_part(LLVM_ONLY))
    tvm.register_global_func("bench.legalize_add", model_reads.subtract, override=True)
    tvm.ir.register_op_attr("relax.add", "FLegalize", model_reads.subtract, level=11)
    model_reads.register_pipeline("bench", model_reads.calling_global("bench.legalize_add"))
    out["per compile, + 3 user registrations"] = median_us(lambda: _reads.registered_part(LLVM_ONLY))
    database = model_reads.tuned_database()
    with database:
        t0 = time.perf_counter()
        _reads.database_part()
        out["database part, first (4 records)"] = (time.perf_counter() - t0) * 1e6
        out["database part, memoized"] = median_us(_reads.database_part)
    mod, _named = relax_models.mlp()
    tvm.compile(mod, "llvm")
    out["warm tvm.compile of the MLP (memory hit)"] = median_us(lambda: tvm.compile(mod, "llvm"), 20)
    cc.disable()
    print(json.dumps(out))
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    runs = []
    for _ in range(args.processes):
        done = subprocess.run([sys.executable, "-c", PROCESS.format(tests=TESTS, repeat=args.repeat)],
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"| what | median µs ({args.processes} processes) |")
    print("| --- | --- |")
    for name in runs[0]:
        print(f"| {name} | {statistics.median(run[name] for run in runs):.1f} |")


if __name__ == "__main__":
    main()
