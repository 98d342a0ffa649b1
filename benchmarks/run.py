"""Benchmarks of tvm-codegen-cache: the hit path against its floor, the cold build, the alternatives.

    python benchmarks/run.py [--quick] [--json OUT.json] [--plot OUT.png]

Sections: 1 hit vs floor vs cold per kernel and codegen (memory, disk, remote hits; floor;
cold miss), 2 scaling (store size; key cost vs IR size), 3 contention (1/2/4 processes),
4 autotuning sweep (2 workers, cold then warm), 5 miss overhead, 6 alternatives (no cache;
a file-per-entry cache), 7 the cache a user gets (min_codegen_time auto) against no cache,
8 a fresh process's first disk hit of a kernel against its floor (bench_fresh_hit.py).
Prints the tables and PASS/FAIL per goal; --json writes every measurement, --plot draws a
summary figure. --quick takes under 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}
ALL_KERNELS = ["vadd", "matmul", "64 funcs", "2048 stmts"]

MODES = {
    "full": {
        "cold_budget": 6.0, "hit_budget": 3.0, "min_hit_reps": 7, "copy_max_hash": 10.0, "jit_max_build": 60.0,
        "nvcc_kernels": ALL_KERNELS,
        "sizes": [100, 1_000, 10_000, 100_000], "files_max": 10_000, "scaling_reps": 31,
        "key_sizes": [128, 256, 512, 1024, 2048], "key_reps": 15,
        "procs": [1, 2, 4], "n_keys": 100, "rounds": 5,
        "cuda_configs": 54, "llvm_configs": 27, "nvcc_configs": 12, "duplicates": 1 / 3, "fresh_rounds": 15,
    },
    "quick": {
        "cold_budget": 1.0, "hit_budget": 0.4, "min_hit_reps": 3, "copy_max_hash": 0.02, "jit_max_build": 0.3,
        "nvcc_kernels": ["vadd"],
        "sizes": [100, 1_000, 10_000], "files_max": 1_000, "scaling_reps": 11,
        "key_sizes": [128, 256, 512, 1024, 2048], "key_reps": 9,
        "procs": [1, 2, 4], "n_keys": 30, "rounds": 3,
        "cuda_configs": 54, "llvm_configs": 6, "nvcc_configs": 2, "duplicates": 1 / 6, "fresh_rounds": 7,
    },
    # Hidden: every section once with tiny counts, for the smoke test.
    "smoke": {
        "cold_budget": 0.05, "hit_budget": 0.02, "min_hit_reps": 2, "copy_max_hash": 0.005, "jit_max_build": 0.3,
        "nvcc_kernels": ["vadd"],
        "sizes": [100, 1_000], "files_max": 1_000, "scaling_reps": 3,
        "key_sizes": [32, 64], "key_reps": 2,
        "procs": [1, 2], "n_keys": 4, "rounds": 1,
        "cuda_configs": 4, "llvm_configs": 2, "nvcc_configs": 0, "duplicates": 0.5, "fresh_rounds": 1,
    },
}


def machine() -> dict:
    """What the numbers were measured on."""
    import sqlite3

    import diskcache
    import tvm
    import tvm_ffi

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_start": os.getloadavg()[0],
        "nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
        "platform": platform.platform(), "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__,
        "diskcache": diskcache.__version__, "sqlite": sqlite3.sqlite_version,
    }
    from codegen_cache.codegens.cuda import nvcc_version

    info["nvcc"] = nvcc_version()
    if shutil.which("redis-server"):
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
        info["redis"] = next((w.split("=", 1)[1] for w in out if w.startswith("v=")), "unknown")
    return info


def section_hits(cfg: dict, root: Path, smoke: bool, remote_url: str | None, log, pool=None) -> tuple[dict, dict]:
    """Sections 1, 5 and 6 in this process (llvm, c, CUDA source), then nvcc in a subprocess."""
    import kernels as K
    from bench_hits import HitBench
    from bench_nvcc import measure_nvcc

    import codegen_cache as cc

    lowered = {}
    t0 = time.perf_counter()
    for name, factory in K.kernel_set(smoke).items():
        for label, target, gpu, compiled in (("llvm", "llvm", False, True), ("c", "c", False, False),
                                             ("cuda-src", CUDA_TARGET, True, False)):
            mod, tgt = cc.prepare_for_codegen(factory(gpu), target)
            lowered[(name, label)] = (mod, tgt, compiled)
    log(f"  lowered {len(lowered)} kernels in {time.perf_counter() - t0:.1f}s")
    if pool is not None:  # started before the lowering above, which is not timed, to overlap with it
        log(f"  {len(pool.procs)} spawned workers for sections 3 and 4 ready after {pool.wait_ready():.1f}s")
    bench = HitBench(root / "hits", remote_url=remote_url)
    rows = []
    try:
        for (name, label), (mod, tgt, compiled) in lowered.items():
            t0 = time.perf_counter()
            rows.append(bench.measure(name, label, mod, tgt, compiled, cold_budget=cfg["cold_budget"],
                                      hit_budget=cfg["hit_budget"], min_hit_reps=cfg["min_hit_reps"],
                                      copy_max_hash=cfg["copy_max_hash"], jit_max_build=cfg["jit_max_build"]))
            log(f"  {name} / {label}: {time.perf_counter() - t0:.1f}s")
    finally:
        bench.close()
    nvcc_kernels = [k for k in cfg["nvcc_kernels"] if k in K.kernel_set(smoke)] or list(K.kernel_set(smoke))[:1]
    nvcc = measure_nvcc(root / "nvcc", nvcc_kernels, cold_budget=cfg["cold_budget"] * 2,
                        hit_budget=cfg["hit_budget"], min_hit_reps=cfg["min_hit_reps"],
                        copy_max_hash=cfg["copy_max_hash"], remote_url=remote_url, log=log)
    if nvcc.get("skipped"):
        nvcc["note"] = f"cuda-nvcc: skipped: {nvcc['skipped']}"
    elif nvcc.get("mode") == "stub-driver":
        nvcc["note"] = ("cuda-nvcc: measured in a subprocess with the stub libcuda.so.1 (tests/cuda_stub.py): "
                        "TVM's CUDA loader really runs; the binary goes into a CUDA context at the first "
                        "launch, which needs a GPU and is not measured.")
    else:
        nvcc["note"] = "cuda-nvcc*: no CUDA driver and no stub: a hit is key + read + unframe of the binary."
    missing = [k for k in ALL_KERNELS if k not in nvcc_kernels]
    if missing and not smoke:
        nvcc["note"] += f" Not run in this mode: {', '.join(missing)}."
    return {"rows": rows}, nvcc


def section_scaling(cfg: dict, root: Path, smoke: bool, log) -> dict:
    """Section 2: store size and key cost."""
    import kernels as K
    from bench_scaling import key_cost, store_scaling

    import codegen_cache as cc

    cases = []
    for label, target, gpu, compiled in (("vadd / cuda-src", CUDA_TARGET, True, False),
                                         ("vadd / llvm", "llvm", False, True)):
        mod, tgt = cc.prepare_for_codegen(K.vadd(gpu), target)
        cases.append((label, mod, tgt, compiled))
    store = store_scaling(root / "scaling", cases, cfg["sizes"], files_max=cfg["files_max"],
                          reps=cfg["scaling_reps"], log=log)
    key_cases = {}
    for label, target, gpu in (("llvm", "llvm", False), ("cuda", CUDA_TARGET, True)):
        key_cases[label] = [(n, *cc.prepare_for_codegen(K.body(gpu, n), target)) for n in cfg["key_sizes"]]
    keys = key_cost(root / "scaling", key_cases, cfg["key_reps"])
    out = {"store": store, "keys": keys}
    if cfg["sizes"][-1] < 100_000:
        out["note"] = (f"this mode stops at {cfg['sizes'][-1]:,} entries; the full run (no --quick) "
                       "goes to 100,000.")
    return out


def run(mode: str, workdir: Path, log, only: set[str] | None = None) -> dict:
    """Every section; the results dict (what --json writes)."""
    import kernels as K
    from bench_parallel import Pool, contention, sweep
    from redis_server import RedisServer, why_no_remote

    # Sections 1-6 measure the tiers (every entry in every tier, in every process they start);
    # section 7's cache is the one a user gets (min_codegen_time auto, an explicit argument).
    os.environ["CODEGEN_CACHE_MIN_CODEGEN_TIME"] = "0"
    cfg = MODES[mode]
    smoke = mode == "smoke"
    results: dict = {"mode": mode, "config": cfg, "machine": machine(), "seconds": {}}
    reason = why_no_remote(REPO)
    server = None
    if reason is None:
        try:
            server = RedisServer(workdir / "redis")
        except (OSError, RuntimeError) as err:
            reason = f"redis-server did not start ({err})"
    remote_url = server.url if server else None
    wanted = only or {"hits", "fresh", "scaling", "parallel"}
    # Started first so that importing TVM in the workers overlaps the (untimed) lowering below.
    pool = Pool(max(cfg["procs"] + [2])) if "parallel" in wanted else None
    try:
        results["hits"] = {"rows": [], "nvcc": {"rows": []}}
        if "hits" in wanted:
            t0 = time.perf_counter()
            log("section 1/5/6: hits, floor, cold, miss overhead, alternatives")
            hits, nvcc = section_hits(cfg, workdir, smoke, remote_url, log, pool)
            hits["nvcc"] = nvcc
            hits["remote_note"] = (f"remote: skipped: {reason}" if reason else
                                   f"remote: redis-server {results['machine'].get('redis', '')} on {remote_url} "
                                   "(loopback), disk tier emptied before each remote hit")
            results["hits"] = hits
            results["seconds"]["hits"] = time.perf_counter() - t0
        if "fresh" in wanted:
            from bench_fresh_hit import measure as fresh_hit

            t0 = time.perf_counter()
            log("section 8: a fresh process's first disk hit of a kernel against its floor")
            results["fresh_hit"] = fresh_hit(cfg["fresh_rounds"], warmup=not smoke)
            results["seconds"]["fresh"] = time.perf_counter() - t0
        if "scaling" in wanted:
            t0 = time.perf_counter()
            log("section 2: scaling")
            results["scaling"] = section_scaling(cfg, workdir, smoke, log)
            results["seconds"]["scaling"] = time.perf_counter() - t0
        if pool is not None:
            t0 = time.perf_counter()
            log("section 3: contention")
            log(f"  {len(pool.procs)} spawned workers ready after {pool.wait_ready():.1f}s")
            results["contention"] = contention(pool, workdir / "contention", cfg["procs"], n_keys=cfg["n_keys"],
                                               rounds=cfg["rounds"], log=log)
            results["seconds"]["contention"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            log("section 4: autotuning sweep")
            cuda = K.matmul_sweep_configs()[: cfg["cuda_configs"]]
            results["sweep"] = sweep(pool, workdir / "sweep", cuda_configs=cuda,
                                     llvm_configs=K.matmul_cpu_configs()[: cfg["llvm_configs"]],
                                     nvcc_configs=cuda[: cfg["nvcc_configs"]] if shutil.which("nvcc") else [],
                                     duplicates=cfg["duplicates"], log=log)
            results["seconds"]["sweep"] = time.perf_counter() - t0
    finally:
        if pool is not None:
            pool.close()
        if server is not None:
            server.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    """Command line: run the benchmarks, print the tables, write --json and --plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and sizes (under 2 minutes)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="OUT.json", help="write every measurement as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help="draw the summary plot (matplotlib)")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # e.g. hits,scaling,parallel (debugging)
    parser.add_argument("--workdir", metavar="DIR", help="where the caches go (default: a temporary directory)")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"

    from plot import plot
    from report import evaluate_goals, tables

    def log(msg: str) -> None:
        print(msg, flush=True)

    start = time.perf_counter()
    # ignore_cleanup_errors: an llvm upgrader (a detached helper process) may still be writing.
    with tempfile.TemporaryDirectory(prefix="codegen-cache-bench-", dir=args.workdir, ignore_cleanup_errors=True) as tmp:
        results = run(mode, Path(tmp), log, set(args.only.split(",")) if args.only else None)
    results["seconds"]["total"] = time.perf_counter() - start
    results["machine"]["loadavg_end"] = os.getloadavg()[0]
    results["goals"] = evaluate_goals(results)
    m = results["machine"]
    print()
    print(f"mode {mode}; {m['date']}; {m['nproc']} x {m['cpu']}; python {m['python']}; tvm {m['tvm']}; "
          f"tvm-ffi {m['tvm_ffi']}; diskcache {m['diskcache']}; sqlite {m['sqlite']}; nvcc {m['nvcc']}; "
          f"load average {m['loadavg_start']:.1f} at start, {m['loadavg_end']:.1f} at end")
    print(tables(results))
    print(f"total {results['seconds']['total']:.0f}s (" +
          ", ".join(f"{k} {v:.0f}s" for k, v in results["seconds"].items() if k != "total") + ")")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    from timing import compile_bytecode

    compile_bytecode()
    sys.exit(main())
