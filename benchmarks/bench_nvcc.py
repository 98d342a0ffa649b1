"""CUDA compiled with nvcc: hit vs floor vs cold, with a real module load where possible.

A compiled CUDA module loads only where TVM's CUDA runtime is loaded, which needs
libcuda.so.1. These machines have no driver, so this runs in a subprocess whose
LD_LIBRARY_PATH holds the stub driver of tests/cuda_stub.py (every cu* call answers "no
device"). TVM's runtime then registers and `load_from_bytes.cuda` really runs; TVM loads
the binary into a CUDA context lazily, at the first launch, so a hit here measures everything
up to that launch. Where the stub cannot be built (no gcc or libcudart), the parent measures
in-process instead and a hit is key + read + unframe of the stored binary (no load).

Run as a script: python bench_nvcc.py PARAMS.json OUT.json (the parent does this).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}

__all__ = ["CUDA_TARGET", "measure_nvcc"]


def _stub_env(root: Path) -> dict[str, str] | None:
    sys.path.insert(0, str(TESTS))
    try:
        from cuda_stub import build_stub
    finally:
        sys.path.remove(str(TESTS))
    try:
        stub = build_stub(root / "stub")
    except (OSError, subprocess.CalledProcessError):
        return None
    if stub is None:
        return None
    return {**os.environ, "LD_LIBRARY_PATH": f"{stub}:{os.environ.get('LD_LIBRARY_PATH', '')}"}


def measure_nvcc(root: Path, kernels: list[str], *, cold_budget: float, hit_budget: float, min_hit_reps: int,
                 copy_max_hash: float, remote_url: str | None, log=print) -> dict:
    """Rows for the nvcc-compiled kernels; {'skipped': reason} where nvcc is missing."""
    from codegen_cache.codegens.cuda import find_nvcc

    if find_nvcc() is None:
        return {"skipped": "nvcc not found (CUDA_PATH, PATH, nvidia-cuda-nvcc wheel)", "rows": []}
    root.mkdir(parents=True, exist_ok=True)
    params = {"root": str(root / "work"), "kernels": kernels, "cold_budget": cold_budget,
              "hit_budget": hit_budget, "min_hit_reps": min_hit_reps,
              "copy_max_hash": copy_max_hash, "remote_url": remote_url}
    env = _stub_env(root)
    if env is None:
        log("  nvcc: no stub driver (gcc or libcudart.so.13 missing): hits are key + read + unframe, no load")
        return {"mode": "no-load", **_run(params, load=False, log=log)}
    (root / "params.json").write_text(json.dumps(params))
    out = root / "out.json"
    done = subprocess.run([sys.executable, str(Path(__file__)), str(root / "params.json"), str(out)],
                          env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise RuntimeError(f"the nvcc benchmark subprocess failed ({done.returncode}):\n{tail}")
    for line in done.stdout.splitlines():
        log(line)
    return {"mode": "stub-driver", **json.loads(out.read_text())}


def _run(params: dict, *, load: bool, log=print) -> dict:
    import time

    import kernels as K
    from bench_hits import HitBench

    import codegen_cache as cc
    from codegen_cache import _compat
    from codegen_cache.codegens import cuda

    if load and not _compat.cuda_runtime_available():
        raise RuntimeError("the stub libcuda did not load TVM's CUDA runtime")
    bench = HitBench(Path(params["root"]), remote_url=params["remote_url"] if load else None)
    rows = []
    try:
        for name in params["kernels"]:
            t0 = time.perf_counter()
            mod, target = cc.prepare_for_codegen(K.kernel(name, True), CUDA_TARGET)
            row = bench.measure(name, "cuda-nvcc", mod, target, True, cold_budget=params["cold_budget"],
                                hit_budget=params["hit_budget"], min_hit_reps=params["min_hit_reps"], load=load,
                                copy_max_hash=params["copy_max_hash"], jit_max_build=0.0,
                                build=None if load else cuda.compile_cuda_payload)
            rows.append(row)
            log(f"  {name} / cuda-nvcc: {time.perf_counter() - t0:.1f}s")
    finally:
        bench.close()
    return {"rows": rows}


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    params = json.loads(Path(sys.argv[1]).read_text())
    result = _run(params, load=True, log=lambda s: print(s, flush=True))
    Path(sys.argv[2]).write_text(json.dumps(result))
