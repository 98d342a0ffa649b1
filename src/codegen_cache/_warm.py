"""`codegen-cache warm`: lower a file's kernels for given targets in worker processes.

A kernels source is a Python file or an importable module. It exposes `kernels` and/or
`variants`: each a mapping name -> PrimFunc/IRModule, an iterable of them, or a callable
returning one (called with the Target when it takes an argument, so a file can give each
target its own variants). Without either, every module-level PrimFunc/IRModule is a kernel.

Workers are spawned (not forked: TVM and SQLite state must not cross a fork) and each imports
the source itself, so nothing TVM-made is pickled between processes.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import importlib.util
import inspect
import json
import multiprocessing
import os
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["KernelSourceError", "load_kernels", "load_source", "parse_target", "warm"]

_KERNEL_ATTRS = ("kernels", "variants")


class KernelSourceError(ValueError):
    """A kernels file or module cannot be loaded, or does not expose kernels."""


def parse_target(text: str):
    """A Target from JSON ('{"kind": "cuda", "arch": "sm_90"}'), a tag/kind, or 'kind -k=v ...'."""
    from tvm.target import Target

    from ._targets import as_target

    text = text.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except ValueError as err:
            raise ValueError(f"Invalid target {text!r}: not valid JSON ({err})") from None
        return as_target(spec)
    try:
        return Target(text)
    except (ValueError, TypeError, RuntimeError):
        pass
    # TVM 0.27 rejects "cuda -arch=sm_90"; the same attributes as a dict are accepted.
    kind, *attrs = text.split()
    spec: dict[str, Any] = {"kind": kind}
    for attr in attrs:
        name, sep, value = attr.lstrip("-").partition("=")
        if not sep or not attr.startswith("-"):
            raise ValueError(f"Invalid target {text!r}: expected 'kind -attr=value ...', JSON, or a tag")
        spec[name] = value
    return as_target(spec)


def load_source(spec: str):
    """Import a kernels file (path ending in .py) or module (dotted name)."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise KernelSourceError(f"kernels file {spec!r} does not exist")
        path = path.resolve()
        name = f"_codegen_cache_kernels_{zlib.crc32(str(path).encode()):08x}"
        if name in sys.modules:
            return sys.modules[name]
        # The file's own directory first, so it can import its neighbours.
        sys.path.insert(0, str(path.parent))
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise KernelSourceError(f"cannot import {spec!r} as Python")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 - user code: any error means "cannot load it"
            del sys.modules[name]
            raise KernelSourceError(f"importing {spec!r} failed: {_last_line(err)}") from err
        return module
    try:
        return importlib.import_module(spec)
    except ImportError as err:
        raise KernelSourceError(f"{spec!r} is neither a .py file nor an importable module ({err})") from None
    except Exception as err:  # noqa: BLE001 - user code
        raise KernelSourceError(f"importing {spec!r} failed: {_last_line(err)}") from err


def _last_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"


def _is_kernel(value: object) -> bool:
    from tvm.ir import IRModule
    from tvm.tirx import PrimFunc

    return isinstance(value, (PrimFunc, IRModule))


def _kernel_name(value, fallback: str) -> str:
    attrs = getattr(value, "attrs", None)
    symbol = attrs.get("global_symbol") if attrs is not None else None
    return str(symbol) if symbol is not None else fallback


def _as_mapping(value: object, where: str, target) -> dict[str, Any]:
    if callable(value) and not _is_kernel(value):
        takes_target = bool(inspect.signature(value).parameters)
        value = value(target) if takes_target else value()
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)) or hasattr(value, "__iter__"):
        values = list(value)  # type: ignore[call-overload]
        names = [_kernel_name(v, f"{where}[{i}]") for i, v in enumerate(values)]
        # Schedules often name every variant "main": number the repeats.
        items = [(n if names.count(n) == 1 else f"{n}[{i}]", v) for i, (n, v) in enumerate(zip(names, values))]
    else:
        raise KernelSourceError(f"{where} must be a mapping, an iterable or a callable, not {type(value).__name__}")
    for name, kernel in items:
        if not _is_kernel(kernel):
            raise KernelSourceError(f"{where}: {name!r} is a {type(kernel).__name__}, not a PrimFunc or IRModule")
    return dict(items)


def load_kernels(spec: str, target=None, *, names: list[str] | None = None) -> dict[str, Any]:
    """The kernels a source exposes (for `target`, when its variants depend on it)."""
    module = load_source(spec)
    kernels: dict[str, Any] = {}
    exposed = [a for a in _KERNEL_ATTRS if hasattr(module, a)]
    for attr in exposed:
        try:
            found = _as_mapping(getattr(module, attr), attr, target)
        except KernelSourceError:
            raise
        except Exception as err:  # noqa: BLE001 - user code building its variants
            raise KernelSourceError(f"{spec}: {attr} failed: {_last_line(err)}") from err
        for name, kernel in found.items():
            if name in kernels:
                raise KernelSourceError(f"{spec}: two kernels are named {name!r}")
            kernels[name] = kernel
    if not exposed:
        kernels = {n: v for n, v in vars(module).items() if not n.startswith("_") and _is_kernel(v)}
    if names:
        missing = [n for n in names if n not in kernels]
        if missing:
            have = sorted(kernels)
            listed = ", ".join(have[:8]) + (f", ... ({len(have)} in all)" if len(have) > 8 else "")
            raise KernelSourceError(f"{spec} has no kernel named {', '.join(missing)}; it has {listed}")
        kernels = {n: kernels[n] for n in names}
    return kernels


def is_lowered(kernel) -> bool:
    """True for a module whose functions are all bound to a target (a codegen's input already)."""
    from tvm.ir import IRModule

    if not isinstance(kernel, IRModule) or not len(kernel.functions):
        return False
    return all(f.attrs is not None and "target" in f.attrs for f in kernel.functions.values())


# ---- workers ------------------------------------------------------------------------------

_worker: dict[str, Any] = {}


def _init_worker(spec: str, directory: str, names: list[str] | None) -> None:
    from ._cache import CodegenCache

    # Settings other than the directory come from the environment this process inherited.
    _worker.update(spec=spec, names=names, cache=CodegenCache(directory, write_behind=False), kernels={})


def _modes(target, mode: str) -> list[bool]:
    from ._registry import default_registry

    entry = default_registry.resolve(target)
    has = {True: entry.build is not None, False: entry.build_without_compile is not None}
    if mode == "both":
        return [m for m in (True, False) if has[m]]
    if mode == "auto":
        return [True] if has[True] else [False]
    return [mode == "compiled"]


def codegen_target(target):
    """The target a codegen is keyed with for an already-lowered module (as lower_kernel gives it)."""
    from tvm.target import Target

    from ._lowering import CPU_KINDS

    if target.kind.name in CPU_KINDS:
        return target if target.host is not None else target.with_host(target)
    if target.host is None:
        return target
    spec = dict(target.export())
    spec.pop("host", None)
    return Target(spec)


def warm_lowered(cache, mod, target, compile_device: bool) -> dict[str, Any]:
    """Put one codegen input into the cache; on a GPU-less host, compiled CUDA is nvcc only."""
    from .codegens.cuda import cuda_runtime_available

    t0 = time.perf_counter()
    if compile_device and target.kind.name == "cuda" and not cuda_runtime_available():
        key = cache.key_for(mod, target, compile_device=True).digest
        store = cache.store("compiled")
        if cache.settings.recache:
            store.delete(key)  # precompile_cuda keeps an existing entry even with recache
        elif store.get(key) is not None:
            return {"status": "hit", "tier": "disk", "key": key, "seconds": time.perf_counter() - t0,
                    "build_seconds": 0.0}
        t1 = time.perf_counter()
        cache.precompile_cuda(mod, target)
        return {"status": "built", "tier": "nvcc", "key": key, "seconds": time.perf_counter() - t0,
                "build_seconds": time.perf_counter() - t1}
    _module, outcome = cache.lower_with_outcome(mod, target, compile_device=compile_device)
    return {"status": "hit" if outcome.hit else "built", "tier": outcome.tier, "key": outcome.key,
            "seconds": time.perf_counter() - t0, "build_seconds": 0.0 if outcome.hit else outcome.build_seconds}


def warm_one(cache, kernel, target, compile_device: bool) -> dict[str, Any]:
    """Lower one kernel (unless it is lowered already) and put it into the cache."""
    from ._lowering import lower_for_codegen

    t0 = time.perf_counter()
    if is_lowered(kernel):
        mod, dev_target = kernel, codegen_target(target)
    else:
        mod, dev_target = lower_for_codegen(kernel, target)
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
        result.update(status="failed", error=_last_line(err), detail=traceback.format_exc(limit=3))
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
    counts = {"built": 0, "hit": 0, "failed": 0}

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
            for task in tasks:
                record(_run_task(*task))
        else:
            ctx = multiprocessing.get_context("spawn")
            with cf.ProcessPoolExecutor(max_workers=min(workers, max(1, len(tasks))), mp_context=ctx,
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
