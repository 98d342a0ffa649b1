"""Where a hit's time goes: each step of CodegenCache's hit path timed alone, then cProfile.

    python benchmarks/profile_hit.py [--codegen cuda-src|cuda-nvcc|c|llvm] [--reps N] [--remote]

The steps are the calls `CodegenCache._lower` makes on a memory hit and a disk hit (private
helpers are called directly: this is a profiling tool, not a user of the API), timed in
interleaved rounds with the whole hit, so "sum of steps" can be compared with "measured".
The miss path is profiled too (cProfile only; a miss is timed in run.py). `cuda-nvcc` (a small
compiled-CUDA entry) re-runs itself with the stub libcuda.so.1 of tests/cuda_stub.py on
LD_LIBRARY_PATH, as bench_nvcc.py does, so that TVM's CUDA loader really runs; its rows add the
floor's own steps (benchmarks/floor.py): what a hit cannot do without.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}


def _hot_kwargs() -> dict:
    """unframe's keywords for what a hit parses (the hot metadata only, where it has that choice)."""
    import inspect

    from codegen_cache._artifacts import unframe

    return {"info": False} if "info" in inspect.signature(unframe).parameters else {}


def _steps(cache, mod, target, compile_device: bool) -> dict:
    from codegen_cache._artifacts import decode, unframe
    from codegen_cache._key import ir_hash
    from codegen_cache._outcome import emit as _emit_fields

    hot = _hot_kwargs()

    entry = cache.resolve(target)
    h = ir_hash(mod)
    key = cache._key(mod, target, entry, compile_device, h)  # noqa: SLF001
    mode = "compiled" if compile_device else "source"
    cache._memory.get(key.digest)  # noqa: SLF001  (the entry is there)
    store = cache.store(mode)
    blob = store.get(key.digest)
    scratch = cache.scratch_dir()
    toolchain = entry.toolchain
    floor = _floor_steps(blob, scratch) if compile_device and getattr(target.kind, "name", "") == "cuda" else {}
    return {
        "resolve (registry lookup per call)": lambda: cache.resolve(target, None),
        "structural hash": lambda: ir_hash(mod),
        "toolchain salts (per call)": (lambda: toolchain(target, compile_device)) if toolchain else (lambda: None),
        "key from parts (_key incl. toolchain)":
            lambda: cache._key(mod, target, entry, compile_device, h),  # noqa: SLF001
        "memory get + same_as": lambda: cache._memory.get(key.digest).ir.same_as(mod),  # noqa: SLF001
        "count hit (stats)": lambda: cache._stats.add_for(entry.name, mode, "hits_memory"),  # noqa: SLF001
        "emit outcome": lambda: _emit_fields(tier="memory", key=key.digest, codegen=entry.name, mode=mode,
                                             key_seconds=0.0, load_seconds=0.0, codegen_seconds=0.0, total_seconds=0.0),
        "3x perf_counter": lambda: (time.perf_counter(), time.perf_counter(), time.perf_counter()),
        "disk: store.get (SQLite)": lambda: store.get(key.digest),
        "disk: scratch dir": cache.scratch_dir,
        "disk: unframe (parse + checksum)": lambda: unframe(blob, **hot),
        "disk: decode (unframe + load)": lambda: decode(blob, scratch=scratch),
        **floor,
    }


def _floor_steps(blob: bytes, scratch: str) -> dict:
    """The independent floor's steps for a compiled-CUDA entry: TVM's hash, a raw SELECT, TVM's load."""
    from floor import floor_loader

    _codec, load = floor_loader(blob, scratch)
    return {"floor: TVM load_from_bytes.cuda of the stored bytes": lambda: load(blob)}


def _compat_cuda_runtime() -> bool:
    from codegen_cache import _compat

    return _compat.cuda_runtime_available()


def _rerun_with_stub() -> int:
    """This script again, with the stub CUDA driver on LD_LIBRARY_PATH (bench_nvcc's way)."""
    import os
    import subprocess

    from bench_nvcc import _stub_env

    root = Path(tempfile.mkdtemp(prefix="profile-hit-stub-"))
    env = _stub_env(root)
    if env is None or os.environ.get("CGC_PROFILE_STUB"):
        raise SystemExit("cuda-nvcc needs TVM's CUDA runtime: no stub driver could be built (gcc, libcudart)")
    env["CGC_PROFILE_STUB"] = "1"
    return subprocess.run([sys.executable, str(Path(__file__)), *sys.argv[1:]], env=env, check=False).returncode


def main() -> int:
    """Print the step table and the cProfile of memory hits, disk hits and misses."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--codegen", default="cuda-src", choices=["cuda-src", "cuda-nvcc", "c", "llvm"])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--remote", action="store_true", help="also profile a remote hit (starts redis-server)")
    args = parser.parse_args()

    import kernels as K
    from timing import fmt_time, interleave

    import codegen_cache as cc

    if args.codegen == "cuda-nvcc" and not _compat_cuda_runtime():
        return _rerun_with_stub()
    gpu = args.codegen in ("cuda-src", "cuda-nvcc")
    compile_device = args.codegen in ("llvm", "cuda-nvcc")
    mod, target = cc.prepare_for_codegen(K.vadd(gpu), CUDA_TARGET if gpu else args.codegen)
    with tempfile.TemporaryDirectory() as tmp:
        filler = cc.CodegenCache(tmp, write_behind=False)
        filler.lower(mod, target, compile_device=compile_device)
        filler.flush(timeout=600, upgrades=True)  # llvm: hits read the shared library, as a later run does
        filler.close()
        mem = cc.CodegenCache(tmp)
        disk = cc.CodegenCache(tmp, memory_entries=0)
        mem.lower(mod, target, compile_device=compile_device)
        variants = {
            "MEMORY HIT (measured)": lambda: mem.lower(mod, target, compile_device=compile_device),
            "DISK HIT (measured)": lambda: disk.lower(mod, target, compile_device=compile_device),
            **_steps(mem, mod, target, compile_device),
        }
        reps = args.reps if args.codegen != "llvm" else min(args.reps, 300)
        times = interleave(variants, reps, warmup=20)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        print(f"vadd / {args.codegen}: medians of {reps} interleaved rounds")
        for name, t in med.items():
            print(f"  {name:<40} {fmt_time(t):>9}")
        mem_steps = ["resolve (registry lookup per call)", "structural hash", "key from parts (_key incl. toolchain)",
                     "memory get + same_as", "count hit (stats)", "emit outcome", "3x perf_counter"]
        print(f"  {'sum of memory-hit steps':<40} {fmt_time(sum(med[s] for s in mem_steps)):>9}")
        over = med["MEMORY HIT (measured)"] - med["structural hash"]
        print(f"  {'memory hit - structural hash':<40} {fmt_time(over):>9}")

        for title, fn, n in (("memory hit", variants["MEMORY HIT (measured)"], reps),
                             ("disk hit", variants["DISK HIT (measured)"], reps)):
            _profile(title, fn, n)
        entry = mem.resolve(target)
        salts = iter(range(10**9))
        miss_cache = cc.CodegenCache(Path(tmp) / "miss")

        def miss():
            miss_cache.lower(mod, target, compile_device=compile_device,
                             codegen=dataclasses.replace(entry, salt=f"p{next(salts)}"))

        miss()  # opens the stores and the lease table: not a per-miss cost
        miss_cache.flush()
        # The write-behind store is waited for outside the profile: this is the caller's path only.
        _profile("miss (caller's path)", miss, 200 if args.codegen not in ("llvm", "cuda-nvcc") else 20,
                 after=miss_cache.flush, sort="cumtime", lines=30)
        if args.remote:
            _profile_remote(tmp, mod, target, compile_device)
        for c in (mem, disk, miss_cache):
            c.close()
    return 0


def _profile(title: str, fn, n: int, *, after=None, sort: str = "tottime", lines: int = 14) -> None:
    prof = cProfile.Profile()
    for _ in range(n):
        prof.enable()
        fn()
        prof.disable()
        if after is not None:
            after()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(sort).print_stats(lines)
    print(f"\n---- cProfile: {title}, {n} calls (sorted by {sort}) ----")
    print("\n".join(line for line in out.getvalue().splitlines()[4:] if line.strip()))


def _profile_remote(tmp: str, mod, target, compile_device: bool) -> None:
    import codegen_cache as cc
    from codegen_cache._cache._writer import writer
    from redis_server import RedisServer
    from timing import fmt_time, interleave

    server = RedisServer(Path(tmp) / "redis")
    try:
        filler = cc.CodegenCache(Path(tmp) / "rfill", remote=server.url, write_behind=False)
        filler.lower(mod, target, compile_device=compile_device)
        remote = cc.CodegenCache(Path(tmp) / "rhit", remote=server.url, memory_entries=0)
        key = remote.key_for(mod, target, compile_device=compile_device).digest
        mode = "compiled" if compile_device else "source"
        store = remote.store(mode)
        tier = remote._remote  # noqa: SLF001
        blob = filler.store(mode).get(key)
        times = interleave({
            # The previous hit's copy is on disk (staged first for a library): gone before each.
            "remote hit (measured)": (lambda: remote.lower(mod, target, compile_device=compile_device),
                                      lambda: (writer.wait(30), store.delete(key), remote.staged(mode).remove(key))),
            "redis GET + envelope check": lambda: tier.get(key),
            "write-through store.put": lambda: store.put(key, blob),
            "disk hit (same cache)": lambda: remote.lower(mod, target, compile_device=compile_device),
        }, 300, warmup=10)
        print("\nremote tier (loopback):")
        for name, xs in times.items():
            print(f"  {name:<40} {fmt_time(sorted(xs)[len(xs) // 2]):>9}")
        filler.close()
        remote.close()
    finally:
        server.stop()


if __name__ == "__main__":
    from timing import compile_bytecode

    compile_bytecode()
    sys.exit(main())
