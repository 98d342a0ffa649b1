"""What a fast path buys on the figure a user sees: each one against the plain code, side by side.

    python benchmarks/bench_cleanup.py [--rounds 15] [--compile-rounds 5] [--json OUT.json]

An optimisation or a private API stays only where it moves a hit, a miss, a cold compile or
enable()+hit by 5% or more (issue 33). Each pair below runs the same code with one fast path
turned into its plain form in the process (what removing it leaves), interleaved:

- memory hit of a CUDA kernel (compile_device=True and False, vector add): the key's environment
  reads through `os.environ._data` against `os.environ.get`; the callback lookups through
  `tvm_ffi.core._get_global_func` against `tvm_ffi.get_global_func`; the key object made by
  `CacheKey.__new__` plus slots against its constructor. Medians of `--rounds` rounds of 400
  calls each, per call.
- cold `tvm.compile` of the Llama-style Relax model through enable() on an empty directory, in
  fresh interpreters: the later modules' structural hashes computed on a helper thread while the
  first module's codegen runs (`_hash_ahead`), against no helper thread. Medians of
  `--compile-rounds` processes per variant, rotated.

The plain forms are what the code reads after the fast path is removed; where it has been
removed already, both variants of a pair run the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TESTS))

from timing import compile_bytecode, fmt_time, interleave  # noqa: E402

CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}


@contextlib.contextmanager
def plain(path: str):
    """Within the block, the fast path `path` takes its plain form."""
    from codegen_cache import _key
    from codegen_cache.codegens import _callbacks, _common

    if path == "environ":
        saved = _common._RAW
        _common._RAW = None  # env_salts / env_values: os.environ.get
        try:
            yield
        finally:
            _common._RAW = saved
    elif path == "global_func" and hasattr(_callbacks, "_lookup"):
        saved = _callbacks._lookup
        _callbacks._lookup = _callbacks._registered  # tvm_ffi.get_global_func
        try:
            yield
        finally:
            _callbacks._lookup = saved
    elif path == "key_new" and "_assemble" in _key.CacheKey.__dict__:
        saved = _key.CacheKey.__dict__["_assemble"]
        _key.CacheKey._assemble = classmethod(lambda cls, ir, tail, digest: cls((ir, *tail), digest))
        try:
            yield
        finally:
            _key.CacheKey._assemble = saved
    else:
        yield


def memory_hits(rounds: int) -> dict:
    import kernels

    import codegen_cache as cc
    from codegen_cache import _compat

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = cc.CodegenCache(Path(tmp) / "c", min_codegen_time=0, write_behind=False)
        mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)
        # compile_device=True needs TVM's CUDA runtime (a driver, or tests/cuda_stub.py's).
        for compile_device in (True, False) if _compat.cuda_runtime_available() else (False,):
            cache.lower(mod, target, compile_device=compile_device)
            assert cache.lower_with_outcome(mod, target, compile_device=compile_device)[1].tier == "memory"
            number = 400

            def batch(path):
                def run():
                    with plain(path):
                        for _ in range(number):
                            cache.lower(mod, target, compile_device=compile_device)
                return run

            samples = interleave({p: batch(p) for p in ("as is", "environ", "global_func", "key_new")}, rounds)
            out["compiled" if compile_device else "source"] = {p: statistics.median(s) / number
                                                               for p, s in samples.items()}
        cache.close()
    return out


CHILD = r"""
import contextlib, json, sys, time
import tvm
import relax_models
variant, target, directory = sys.argv[1], sys.argv[2], sys.argv[3]
target = tvm.target.Target(json.loads(target) if target.startswith("{") else target)
mod, _ = relax_models.llama(layers=4)
import codegen_cache as cc
if variant == "no helper thread":
    from codegen_cache._build import _build
    _build.ir_hashes_ahead = lambda modules: contextlib.nullcontext()
cc.enable(cc.CodegenCache(directory), children=False)
t0, c0 = time.perf_counter(), time.process_time()
tvm.compile(mod, target)
print(json.dumps({"compile": time.perf_counter() - t0, "cpu": time.process_time() - c0}))
"""


def cold_compiles(rounds: int, targets: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    env.pop("CODEGEN_CACHE_ENABLE", None)
    variants = ["hash ahead", "no helper thread"]
    out = {}
    for target in targets:
        samples: dict[str, list[dict]] = {v: [] for v in variants}
        for r in range(rounds):
            for variant in variants[r % 2:] + variants[:r % 2]:
                with tempfile.TemporaryDirectory() as tmp:
                    done = subprocess.run([sys.executable, "-c", CHILD, variant, target, tmp], capture_output=True,
                                          text=True, env=env, timeout=600, check=True)
                samples[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
        out[target] = {v: {k: statistics.median(s[k] for s in samples[v]) for k in ("compile", "cpu")}
                       for v in variants}
        out[target]["samples"] = samples
    return out


def cold_compiles_in_process(rounds: int, targets: list[str]) -> dict:
    """Cold tvm.compile through enable() on a new directory each time, in this process (TVM imported
    once: no interpreter start in the figure), with and without the helper thread, interleaved."""
    import contextlib

    import relax_models
    import tvm

    import codegen_cache as cc
    from codegen_cache._build import _build

    ahead = getattr(_build, "ir_hashes_ahead", None)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        count = [0]

        def compile_once(target, helper):
            count[0] += 1
            cache = cc.CodegenCache(Path(tmp) / str(count[0]))
            if ahead is not None:
                _build.ir_hashes_ahead = ahead if helper else (lambda modules: contextlib.nullcontext())
            mod, _ = relax_models.llama(layers=4)
            cc.enable(cache, children=False)
            try:
                t0 = time.perf_counter()
                tvm.compile(mod, target)
                return time.perf_counter() - t0
            finally:
                cc.disable()
                if ahead is not None:
                    _build.ir_hashes_ahead = ahead
                cache.close()

        for name in targets:
            target = tvm.target.Target(json.loads(name) if name.startswith("{") else name)
            compile_once(target, True)  # the first compile of the process pays one-time costs
            times = {"hash ahead": [], "no helper thread": []}
            for r in range(rounds):
                for variant in list(times)[r % 2:] + list(times)[:r % 2]:
                    times[variant].append(compile_once(target, variant == "hash ahead"))
            out[name] = {v: statistics.median(t) for v, t in times.items()}
            out[name]["pairs"] = statistics.median(b / a for a, b in zip(times["hash ahead"], times["no helper thread"]))
            out[name]["samples"] = times
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="memory-hit rounds (0: none; compiled CUDA needs "
                        "a CUDA runtime: tests/cuda_stub.py's on LD_LIBRARY_PATH, with TVM_CUDA_COMPILE_MODE=nvcc)")
    parser.add_argument("--compile-rounds", type=int, default=5)
    parser.add_argument("--targets", nargs="+", default=["cuda", "llvm"])
    parser.add_argument("--in-process-rounds", type=int, default=0,
                        help="cold compiles in this process instead of fresh ones (no interpreter start)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    compile_bytecode()
    results: dict = {"load": os.getloadavg()}
    t0 = time.perf_counter()
    hits = results["memory_hits"] = memory_hits(args.rounds) if args.rounds else {}
    if hits:
        print("memory hit of a CUDA vector add, per call (medians):")
    for mode, row in hits.items():
        base = row["as is"]
        print(f"  {mode:9} as is {fmt_time(base)}; " + "; ".join(
            f"{p} plain {fmt_time(v)} ({v / base:.3f}x)" for p, v in row.items() if p != "as is"))
    targets = {"cuda": json.dumps(CUDA_TARGET), "llvm": "llvm"}
    if args.in_process_rounds:
        cold = results["cold_compile_in_process"] = cold_compiles_in_process(args.in_process_rounds,
                                                                             [targets[t] for t in args.targets])
        print("cold tvm.compile (Llama, 4 layers) through enable() on a new directory, in one process (medians):")
        for target, row in cold.items():
            a, b = row["hash ahead"], row["no helper thread"]
            print(f"  {target:40} hash ahead {fmt_time(a)}; no helper thread {fmt_time(b)}: {b / a:.3f}x "
                  f"(per-round pairs {row['pairs']:.3f}x)")
    if args.compile_rounds:
        cold = results["cold_compile"] = cold_compiles(args.compile_rounds, [targets[t] for t in args.targets])
        print("cold tvm.compile (Llama, 4 layers) through enable(), fresh processes (medians):")
        for target, row in cold.items():
            a, b = row["hash ahead"], row["no helper thread"]
            print(f"  {target:40} hash ahead {fmt_time(a['compile'])} (cpu {fmt_time(a['cpu'])}); no helper thread "
                  f"{fmt_time(b['compile'])} (cpu {fmt_time(b['cpu'])}): {b['compile'] / a['compile']:.3f}x wall")
    results["load_after"] = os.getloadavg()
    print(f"load {results['load'][0]:.1f} -> {results['load_after'][0]:.1f}; {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
