"""A worker process for the single-flight tests and benchmark.

usage: flight_worker.py CACHE_DIR FIRST COUNT [--lease-wait S] [--start-at T]
Lowers variants FIRST..FIRST+COUNT-1 with the slow codegen, checks each result runs
correctly, and prints one JSON line: tiers, wall time, and this process's counters.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import tvm  # noqa: E402

import codegen_cache as cc  # noqa: E402
from slow_codegen import SLOW_LLVM  # noqa: E402
from variants import variant  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("first", type=int)
    parser.add_argument("count", type=int)
    parser.add_argument("--lease-wait", type=float, default=None)
    parser.add_argument("--start-at", type=float, default=None, help="time.time() to start lowering at")
    args = parser.parse_args()
    cache = cc.CodegenCache(args.directory, lease_wait=args.lease_wait)
    inputs = [variant(i) for i in range(args.first, args.first + args.count)]
    print(json.dumps({"ready": True}), flush=True)
    tiers, wrong = [], []
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))  # a common start for all workers
    started = time.time()
    start = time.perf_counter()
    for i, (mod, target) in zip(range(args.first, args.first + args.count), inputs):
        module, outcome = cache.lower_with_outcome(mod, target, codegen=SLOW_LLVM)
        tiers.append(outcome.tier)
        a = np.arange(256, dtype="float32")
        out = tvm.runtime.tensor(np.zeros(256, "float32"))
        module[f"add_{i}"](tvm.runtime.tensor(a), out)
        if not np.array_equal(out.numpy(), a + i):
            wrong.append(i)
    wall = time.perf_counter() - start
    cache.close()
    print(json.dumps({"tiers": tiers, "wrong": wrong, "wall": wall, "started": started, "ended": started + wall, "stats": cache.stats(shared=False).as_dict()}), flush=True)


if __name__ == "__main__":
    main()
