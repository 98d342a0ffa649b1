"""`codegen-cache warm`: lower a file's kernels for given targets in worker processes.

Workers are spawned (not forked: TVM and SQLite state must not cross a fork) and each imports
the kernels source itself (see _kernels.py), so nothing TVM-made is pickled between processes.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from .._helper import spawned_without_working_directory
from ._kernel_files import KernelSourceError, codegen_target, is_lowered, last_line, load_kernels, parse_target

__all__ = ["default_workers", "plan", "warm", "warm_lowered", "warm_one"]

# ---- workers ------------------------------------------------------------------------------

_worker: dict[str, Any] = {}


def _init_worker(spec: str, directory: str, names: list[str] | None) -> None:
    from .._cache._cache import CodegenCache

    # Settings other than the directory come from the environment this process inherited.
    _worker.update(spec=spec, names=names, cache=CodegenCache(directory, write_behind=False, min_codegen_time=0),
                   kernels={})  # warm fills the stores: every entry, cheap or not


def _modes(target, mode: str) -> list[bool]:
    from .._registry import default_registry

    codegen = default_registry.resolve(target)
    has = {True: codegen.build is not None, False: codegen.build_without_compile is not None}
    if mode == "both":
        return [m for m in (True, False) if has[m]]
    if mode == "auto":
        return [True] if has[True] else [False]
    return [mode == "compiled"]


def warm_lowered(cache, mod, target, compile_device: bool) -> dict[str, Any]:
    """Put one codegen input into the cache; on a GPU-less host, compiled CUDA is nvcc only."""
    from .._compat import cuda_runtime_available

    t0 = time.perf_counter()
    if compile_device and target.kind.name == "cuda" and not cuda_runtime_available():
        key = cache.key_for(mod, target, compile_device=True).digest
        store = cache.store("compiled")
        if cache.settings.recache:
            store.delete(key)  # precompile_cuda keeps an existing entry even with recache
        had = not cache.settings.recache and cache.has_entry("compiled", key)
        t1 = time.perf_counter()
        cache.precompile_cuda(mod, target)  # counts the hit or the miss, as a lowering would
        return _result("hit" if had else "codegen", "disk" if had else "nvcc", key, time.perf_counter() - t0,
                       0.0 if had else time.perf_counter() - t1)
    _module, outcome = cache.lower_with_outcome(mod, target, compile_device=compile_device)
    # "uncached": the lowering reads an input the key cannot hold; it ran, nothing was stored.
    status = "hit" if outcome.hit else "uncacheable" if outcome.tier == "uncached" else "codegen"
    return _result(status, outcome.tier, outcome.key, time.perf_counter() - t0,
                   0.0 if outcome.hit else outcome.codegen_seconds)


def _result(status: str, tier: str, key: str, seconds: float, codegen_seconds: float) -> dict[str, Any]:
    return {"status": status, "tier": tier, "key": key, "seconds": seconds, "codegen_seconds": codegen_seconds}


def warm_one(cache, kernel, target, compile_device: bool) -> dict[str, Any]:
    """Lower one kernel (unless it is lowered already) and put it into the cache."""
    from .._build._prepare import prepare_for_codegen

    t0 = time.perf_counter()
    if is_lowered(kernel):
        mod, dev_target = kernel, codegen_target(target)
    else:
        mod, dev_target = prepare_for_codegen(kernel, target)
    lowering = time.perf_counter() - t0
    result = warm_lowered(cache, mod, dev_target, compile_device)
    result["seconds"] += lowering
    return result


def _run_task(name: str, target_text: str, compile_device: bool) -> dict[str, Any]:
    cache = _worker["cache"]
    result: dict[str, Any] = {"kernel": name, "target": target_text, "mode": "compiled" if compile_device else "source"}
    try:
        target = parse_target(target_text)
        kernels = _worker["kernels"].get(target_text)
        if kernels is None:
            kernels = _worker["kernels"][target_text] = load_kernels(_worker["spec"], target, names=_worker["names"])
        result.update(warm_one(cache, kernels[name], target, compile_device))
    except Exception as err:  # noqa: BLE001 - one kernel's failure is reported, the others go on
        result.update(status="failed", error=last_line(err), detail=traceback.format_exc(limit=3))
    finally:
        cache.flush()
    return result


def plan(spec: str, targets: list[str], mode: str, names: list[str] | None, directory: str) -> list[tuple]:
    """The (kernel name, target, compile_device) tasks, checked in this process."""
    tasks = []
    for text in targets:
        target = parse_target(text)
        kernels = load_kernels(spec, target, names=names)
        if not kernels:
            raise KernelSourceError(f"{spec} exposes no kernels (define `kernels`, `variants`, or PrimFuncs)")
        for compile_device in _modes(target, mode):
            tasks.extend((name, text, compile_device) for name in kernels)
    return tasks


def warm(spec: str, targets: list[str], directory: str, *, workers: int, mode: str = "auto",
         names: list[str] | None = None, progress: bool | None = None,
         on_result: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Warm the cache in `directory`; returns per-task results and totals."""
    from tqdm import tqdm

    tasks = plan(spec, targets, mode, names, directory)
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    bar = tqdm(total=len(tasks), unit="kernel", desc="warm", disable=None if progress is None else not progress,
               file=sys.stderr)
    counts = {"codegen": 0, "hit": 0, "uncacheable": 0, "failed": 0}

    def record(result: dict[str, Any]) -> None:
        results.append(result)
        counts[result["status"]] += 1
        bar.set_postfix(counts, refresh=False)
        bar.update()
        if on_result is not None:
            on_result(result)

    try:
        if workers <= 0:
            _init_worker(spec, directory, names)
            try:
                for task in tasks:
                    record(_run_task(*task))
            finally:
                _worker.pop("cache").close()
        else:
            ctx = multiprocessing.get_context("spawn")
            with spawned_without_working_directory(), \
                    cf.ProcessPoolExecutor(max_workers=min(workers, max(1, len(tasks))), mp_context=ctx,
                                           initializer=_init_worker, initargs=(spec, directory, names)) as pool:
                futures = [pool.submit(_run_task, *task) for task in tasks]
                try:
                    for future in cf.as_completed(futures):
                        record(future.result())
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    finally:
        bar.close()
    return {"tasks": len(tasks), "workers": workers, "seconds": time.perf_counter() - t0, **counts,
            "results": results}


def default_workers() -> int:
    """One worker per CPU this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
