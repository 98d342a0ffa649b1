"""What verify=True costs on a disk hit, side by side with verify=False, per kernel.

    python benchmarks/bench_verify.py [--repeat 200]

verify=True keeps an exact digest of the IRModule (xxh3-128 of tvm.ir.save_json) in each
entry and recomputes it on every disk/remote hit, so a 64-bit structural-hash collision can
never return the wrong module. Reported: median structural hash, median digest, median disk
hit without and with verify, and the cold build, all in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import kernels  # noqa: E402

import codegen_cache as cc  # noqa: E402
from codegen_cache._cache._tiers import ir_digest as _ir_digest  # noqa: E402
from codegen_cache._key import ir_hash  # noqa: E402

CASES = [("llvm vector add", kernels.vadd, "llvm", True),
         ("cuda vector add (source)", kernels.vadd_gpu, {"kind": "cuda", "arch": "sm_90"}, False)]


def median_us(func, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        func()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(f"{'kernel':<26}{'hash us':>9}{'digest us':>11}{'hit us':>9}{'hit+verify us':>15}{'ratio':>7}{'cold us':>10}")
    for name, func, target, compiled in CASES:
        mod, tgt = cc.prepare_for_codegen(func, target)
        with tempfile.TemporaryDirectory() as plain_dir, tempfile.TemporaryDirectory() as verify_dir:
            plain = cc.CodegenCache(plain_dir, memory_entries=0, write_behind=False)
            verified = cc.CodegenCache(verify_dir, memory_entries=0, write_behind=False, verify=True)
            t0 = time.perf_counter()
            plain.lower(mod, tgt, compile_device=compiled)
            cold = (time.perf_counter() - t0) * 1e6
            verified.lower(mod, tgt, compile_device=compiled)
            # Interleave the two so machine noise hits both alike.
            hit, hit_verify = [], []
            for _ in range(args.repeat):
                hit.append(median_us(lambda: plain.lower(mod, tgt, compile_device=compiled), 1))
                hit_verify.append(median_us(lambda: verified.lower(mod, tgt, compile_device=compiled), 1))
            h = median_us(lambda: ir_hash(mod), args.repeat)
            d = median_us(lambda: _ir_digest(mod), max(20, args.repeat // 10))
            m, mv = statistics.median(hit), statistics.median(hit_verify)
            plain.close()
            verified.close()
            print(f"{name:<26}{h:>9.1f}{d:>11.1f}{m:>9.1f}{mv:>15.1f}{mv / m:>6.1f}x{cold:>10.0f}")


if __name__ == "__main__":
    main()
