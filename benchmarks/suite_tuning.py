"""Processes sharing one cache directory (spawned, as autotuners do): contention and an autotuning sweep.

One pool of spawned workers serves both (starting a process that imports TVM costs seconds of
CPU; a fresh CodegenCache object per run stands in for a fresh process: it has its own memory
tier and opens the stores anew).

Contention: P workers walk the same list of fresh keys, each in its own order (each key is
one build and P-1 hits or lease waits), then walk it again `rounds` times (all disk hits).
Sweep: 2 workers take configs from one queue, lower each kernel and run its codegen through
the cache, cold (empty directory), then warm (new cache objects, same directory).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from timing import percentile, row

__all__ = ["Pool", "contention", "sweep"]

CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}

ROUNDS = 5
DESCRIPTION = (
    "Processes sharing one cache directory, spawned as autotuners spawn them: 1, 2 and 4 processes lowering the same "
    "fresh CUDA-source keys at once (each key one build, the rest hits or waits on its build lease), then walking "
    "them again (all disk hits); and an autotuning sweep of two workers over one queue of matmul configurations "
    "(CUDA source, llvm, nvcc where installed; some configurations twice), cold on an empty directory, then warm. "
    "**Floor**: one process alone (throughput), and the number of unique configurations (builds). **Goals**: every "
    "key built once whatever the number of processes; the cold sweep compiles each unique configuration once; the "
    "warm sweep calls no codegen.")


def _worker(wid: int, commands, results, tasks) -> None:
    import kernels as K

    import codegen_cache as cc

    mod, target = cc.prepare_for_codegen(K.vadd(True), CUDA_TARGET)
    entry = cc.resolve_device_codegen(target)
    cache = None
    results.put((wid, "ready"))
    while True:
        cmd, args = commands.get()
        if cmd == "exit":
            break
        if cmd == "open":  # a new cache object on a directory; opens every store before timing
            if cache is not None:
                cache.close()
            cache = cc.CodegenCache(args["directory"], **args.get("options", {}))
            cache.lower(mod, target, compile_device=False, codegen=dataclasses.replace(entry, salt=f"warm-{wid}"))
            cache.flush()
            results.put((wid, "open"))
        elif cmd == "walk":
            results.put((wid, _walk(cache, mod, target, entry, **args)))
        elif cmd == "sweep":
            results.put((wid, _sweep_tasks(cache, tasks)))
        elif cmd == "stats":
            results.put((wid, cache.stats(shared=False).as_dict()))
    if cache is not None:
        cache.close()


def _walk(cache, mod, target, entry, *, n_keys: int, repeat: int, seed: int, start_at: float) -> dict:
    codegens = [dataclasses.replace(entry, salt=f"contention-{i}") for i in range(n_keys)]
    rng = random.Random(seed)
    order = [i for _ in range(repeat) for i in rng.sample(range(n_keys), n_keys)]
    time.sleep(max(0.0, start_at - time.time()))
    lat, tiers = [], []
    start = time.time()
    for i in order:
        t0 = time.perf_counter()
        _, outcome = cache.lower_with_outcome(mod, target, compile_device=False, codegen=codegens[i])
        lat.append(time.perf_counter() - t0)
        tiers.append(outcome.tier)
    end = time.time()
    cache.flush()  # stores of this walk are visible before the next one starts
    return {"start": start, "end": end, "lat": lat, "tiers": tiers}


def _lower(sweep_name: str, cfg: dict):
    """Lower one sweep kernel (every run lowers again, as a re-run tuning session would)."""
    import kernels as K

    import codegen_cache as cc

    if sweep_name == "llvm":
        return cc.prepare_for_codegen(K.matmul(False, n=128, **cfg), "llvm")
    return cc.prepare_for_codegen(K.matmul(True, **cfg), CUDA_TARGET)


def _sweep_tasks(cache, tasks) -> list[dict]:
    records = []
    while True:
        task = tasks.get()
        if task is None:
            break
        sweep_name, cfg = task
        t0 = time.perf_counter()
        mod, target = _lower(sweep_name, cfg)
        t1 = time.perf_counter()
        if sweep_name == "cuda-nvcc":
            before = cache.stats(shared=False).codegen_runs
            cache.precompile_cuda(mod, target)
            built = cache.stats(shared=False).codegen_runs - before
        else:
            _, outcome = cache.lower_with_outcome(mod, target, compile_device=(sweep_name == "llvm"))
            built = int(outcome.tier == "codegen")
        records.append({"sweep": sweep_name, "cfg": cfg, "lower": t1 - t0,
                        "codegen": time.perf_counter() - t1, "built": built})
    cache.flush()
    return records


class Pool:
    """`size` spawned workers, each with its own command queue; one shared task queue."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.results, self.tasks = ctx.Queue(), ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(size)]
        self.procs = [ctx.Process(target=_worker, args=(i, self.commands[i], self.results, self.tasks), daemon=True)
                      for i in range(size)]
        self._t0 = time.monotonic()
        for p in self.procs:
            p.start()
        self.start_seconds: float | None = None

    def wait_ready(self) -> float:
        """Wait until every worker has imported TVM and lowered its kernel; seconds since start."""
        if self.start_seconds is None:
            self.gather(len(self.procs))
            self.start_seconds = time.monotonic() - self._t0
        return self.start_seconds

    def send(self, wids, cmd: str, args_for=lambda wid: {}) -> list:
        """Send a command to the workers `wids`; their replies, in wid order."""
        for wid in wids:
            self.commands[wid].put((cmd, args_for(wid)))
        return self.gather(len(wids))

    def gather(self, n: int, timeout: float = 3600) -> list:
        """`n` replies, sorted by worker id."""
        got = [self.results.get(timeout=timeout) for _ in range(n)]
        return [r for _, r in sorted(got, key=lambda x: x[0])]

    def close(self) -> None:
        """Stop every worker (the ones this pool started) and reap them."""
        for q in self.commands:
            q.put(("exit", {}))
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()


# ---- contention -----------------------------------------------------------------------------


def contention(pool: Pool, root: Path, procs: list[int], *, n_keys: int, rounds: int, log=print) -> dict[str, Any]:
    """Throughput and p50/p99 of misses and hits with 1, 2, 4 processes on shared keys."""
    out: dict[str, Any] = {"n_keys": n_keys, "rounds": rounds, "codegen": "cuda-src vadd", "runs": []}
    for p in procs:
        wids = list(range(p))
        pool.send(wids, "open", lambda w: {"directory": str(Path(root) / f"p{p}"), "options": {"memory_entries": 0}})
        run: dict[str, Any] = {"procs": p}
        for phase, repeat in (("miss", 1), ("hit", rounds)):
            start_at = time.time() + 0.3
            got = pool.send(wids, "walk", lambda w: {"n_keys": n_keys, "repeat": repeat, "seed": 1000 * p + w,
                                                     "start_at": start_at})
            lat = [x for g in got for x in g["lat"]]
            tiers = [t for g in got for t in g["tiers"]]
            wall = max(g["end"] for g in got) - min(g["start"] for g in got)
            run[phase] = {"ops": len(lat), "wall": wall, "throughput": len(lat) / wall,
                          "p50": percentile(lat, 50), "p99": percentile(lat, 99), "max": max(lat),
                          "tiers": {t: tiers.count(t) for t in sorted(set(tiers))}}
        stats = pool.send(wids, "stats")
        # Each worker's warm-up lowering is one build of its own: not counted.
        run["builds"] = sum(s["codegen_runs"] for s in stats) - p
        run["lease_waits"] = sum(s["lease_waits"] for s in stats)
        out["runs"].append(run)
        log(f"  {p} process(es): miss {run['miss']['throughput']:.0f}/s, hit {run['hit']['throughput']:.0f}/s, "
            f"{run['builds']} builds for {n_keys} keys")
    return out


# ---- autotuning sweep -----------------------------------------------------------------------


def _sweep_run(pool: Pool, directory: str, tasks: list, workers: int) -> dict[str, Any]:
    wids = list(range(workers))
    pool.send(wids, "open", lambda w: {"directory": directory})
    t0 = time.monotonic()
    for task in tasks:
        pool.tasks.put(task)
    for _ in wids:
        pool.tasks.put(None)
    records = [r for rs in pool.send(wids, "sweep") for r in rs]
    wall = time.monotonic() - t0
    per: dict[str, Any] = {}
    for name in sorted({r["sweep"] for r in records}):
        rs = [r for r in records if r["sweep"] == name]
        per[name] = {
            "tasks": len(rs),
            "unique": len({tuple(sorted(r["cfg"].items())) for r in rs}),
            "codegen_calls": sum(r["built"] for r in rs),
            "lower_seconds": sum(r["lower"] for r in rs),
            "codegen_seconds": sum(r["codegen"] for r in rs),
        }
    return {"wall": wall, "sweeps": per}


def sweep(pool: Pool, root: Path, *, cuda_configs: list[dict], llvm_configs: list[dict], nvcc_configs: list[dict],
          duplicates: float, workers: int = 2, seed: int = 7, log=print) -> dict[str, Any]:
    """Cold then warm runs of the CUDA source, llvm and nvcc sweeps; duplicated configs included."""
    import codegen_cache as cc

    rng = random.Random(seed)
    tasks = []
    for name, configs in (("cuda-src", cuda_configs), ("llvm", llvm_configs), ("cuda-nvcc", nvcc_configs)):
        dup = rng.sample(configs, max(1, int(round(len(configs) * duplicates)))) if configs else []
        tasks += [(name, c) for c in configs + dup]
    rng.shuffle(tasks)
    directory = str(Path(root) / "sweep")
    out: dict[str, Any] = {"workers": workers, "duplicates": duplicates}
    for phase in ("cold", "warm"):
        run = _sweep_run(pool, directory, tasks, workers)
        out[phase] = run
        log(f"  {phase}: {run['wall']:.1f}s, " + ", ".join(
            f"{k} {v['codegen_calls']} codegen calls / {v['tasks']} tasks ({v['unique']} unique)"
            for k, v in run["sweeps"].items()))
    out["shared_builds"] = cc.CodegenCache(directory).stats().codegen_runs
    return out


def run(rounds: int) -> list[dict]:
    """Contention with 1, 2, 4 processes and the cold and warm sweep, as rows."""
    import kernels as K

    smoke = rounds <= 2
    procs = [1, 2] if smoke else [1, 2, 4]
    n_keys = 4 if smoke else 30 if rounds < ROUNDS else 100
    cuda = K.matmul_sweep_configs()[: 4 if smoke else 54]
    llvm = K.matmul_cpu_configs()[: 2 if smoke else 6 if rounds < ROUNDS else 27]
    nvcc = cuda[: 0 if smoke else 2 if rounds < ROUNDS else 12] if shutil.which("nvcc") else []
    rows = []
    saved = os.environ.get("CODEGEN_CACHE_MIN_CODEGEN_TIME")
    os.environ["CODEGEN_CACHE_MIN_CODEGEN_TIME"] = "0"  # every entry in every tier, in the workers too
    pool = Pool(max(procs))
    try:
        with tempfile.TemporaryDirectory(prefix="bench-tuning-", ignore_cleanup_errors=True) as tmp:
            pool.wait_ready()
            found = contention(pool, Path(tmp) / "contention", procs, n_keys=n_keys, rounds=rounds, log=lambda *_: None)
            alone = {phase: found["runs"][0][phase]["p50"] for phase in ("miss", "hit")}
            for r in found["runs"]:
                for phase, label in (("miss", "a miss"), ("hit", "a disk hit")):
                    rows.append(row(f"{r['procs']} process(es): {label}, p50", r[phase]["p50"], floor=alone[phase],
                                    note=f"floor: one process alone; p99 {r[phase]['p99'] * 1e3:.2f} ms; "
                                         f"{r[phase]['throughput']:.0f} per s in all"))
                rows.append(row(f"{r['procs']} process(es): builds for {n_keys} shared keys", r["builds"], unit="builds",
                                floor=n_keys, goal="= keys", ok=r["builds"] == n_keys,
                                note=f"{r['lease_waits']} lease waits"))
            swept = sweep(pool, Path(tmp) / "sweep", cuda_configs=cuda, llvm_configs=llvm, nvcc_configs=nvcc,
                          duplicates=0.5 if smoke else 1 / 3, log=lambda *_: None)
            for name, s in swept["cold"]["sweeps"].items():
                rows.append(row(f"cold sweep, {name}: codegen calls", s["codegen_calls"], unit="calls", floor=s["unique"],
                                goal="= unique configs", ok=s["codegen_calls"] == s["unique"],
                                note=f"{s['tasks']} tasks; {swept['cold']['wall']:.1f} s for every sweep"))
            for name, s in swept["warm"]["sweeps"].items():
                rows.append(row(f"warm sweep, {name}: codegen calls", s["codegen_calls"], unit="calls", goal="= 0",
                                ok=s["codegen_calls"] == 0,
                                note=f"{s['tasks']} tasks; {swept['warm']['wall']:.1f} s for every sweep"))
    finally:
        pool.close()
        if saved is None:
            os.environ.pop("CODEGEN_CACHE_MIN_CODEGEN_TIME", None)
        else:
            os.environ["CODEGEN_CACHE_MIN_CODEGEN_TIME"] = saved
    return rows
