"""A memory hit in a tight loop against the structural hash alone, side by side.

    python benchmarks/bench_memory_hit.py [--number 20000]

run.py interleaves many variants per round, so each memory hit there runs with cold CPU
caches; this measures the same call back to back (the notebook / autotuning-loop case).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import kernels  # noqa: E402

import codegen_cache as cc  # noqa: E402
from codegen_cache._key import ir_hash  # noqa: E402

CASES = [("cuda vector add (source)", kernels.vadd_gpu, {"kind": "cuda", "arch": "sm_90"}, False),
         ("llvm vector add", kernels.vadd, "llvm", True)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    print(f"{'kernel':<26}{'hash us':>9}{'memory hit us':>15}{'hit - hash us':>15}")
    for name, func, target, compiled in CASES:
        mod, tgt = cc.prepare_for_codegen(func, target)
        with tempfile.TemporaryDirectory() as tmp:
            cache = cc.CodegenCache(tmp)
            cache.lower(mod, tgt, compile_device=compiled)
            hashes, hits = [], []
            for _ in range(7):  # alternate the two, keep the medians of 7 batches each
                hashes.append(timeit.timeit(lambda: ir_hash(mod), number=args.number) / args.number)
                hits.append(timeit.timeit(lambda: cache.lower(mod, tgt, compile_device=compiled),
                                          number=args.number) / args.number)
            cache.close()
        h, m = statistics.median(hashes) * 1e6, statistics.median(hits) * 1e6
        print(f"{name:<26}{h:>9.1f}{m:>15.1f}{m - h:>15.1f}")


if __name__ == "__main__":
    main()
