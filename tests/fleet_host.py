"""One "host" of a simulated fleet: a process with its own cache directory and a shared remote.

usage: fleet_host.py DIR FIRST COUNT --remote URL [--secret S] [--start-at T] [--start-file F]
                     [--exit normal|os_exit|wait] [--lease-wait S] [--codegen slow|llvm] [--flush-upgrades]
                     [--hold-writer]

Lowers variants FIRST..FIRST+COUNT-1 (tests/variants.py: `C[j] = A[j] + i`, llvm), runs each
result and checks it, and prints one JSON line: the tier of each lowering, wrong results, the
time of each call, and this process's counters. Then it exits as asked: normally (closing the
cache), with os._exit(0) right after lowering one more variant (FIRST+COUNT), or by waiting to
be killed. --hold-writer: the background writer starts no job meanwhile (writer.hold(), up to
its HOLD_SECONDS), so what os._exit loses is what only the writer would have written. With
--codegen slow the codegen
sleeps SLOW_CODEGEN_SECONDS and logs each call to SLOW_CODEGEN_LOG (tests/slow_codegen.py).
`lower_range` is the same work for a multiprocessing pool's workers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import tvm  # noqa: E402

import codegen_cache as cc  # noqa: E402
from codegen_cache._cache._writer import writer  # noqa: E402
from slow_codegen import SLOW_LLVM  # noqa: E402
from variants import variant  # noqa: E402

_caches: dict[tuple, cc.CodegenCache] = {}


def lower_range(directory: str, first: int, count: int, remote: str, secret: str | None, codegen: str = "slow",
                lease_wait: float | None = None, start_at: float | None = None, start_file: str | None = None) -> dict:
    """Lower and check variants first..first+count-1 through the cache of `directory` (one per process)."""
    key = (directory, remote, secret, lease_wait)
    cache = _caches.get(key)
    if cache is None:
        cache = _caches[key] = cc.CodegenCache(directory, remote=remote, remote_secret=secret, lease_wait=lease_wait)
    inputs = [variant(i) for i in range(first, first + count)]
    if start_at:
        time.sleep(max(0.0, start_at - time.time()))  # a common start for every host
    if start_file:
        print(json.dumps({"ready": True}), flush=True)
        while not os.path.exists(start_file):  # the test says when
            time.sleep(0.01)
    tiers, wrong, seconds, kinds = [], [], [], []
    for i, (mod, target) in zip(range(first, first + count), inputs):
        t0 = time.perf_counter()
        module, outcome = cache.lower_with_outcome(mod, target, codegen=SLOW_LLVM if codegen == "slow" else None)
        seconds.append(time.perf_counter() - t0)
        tiers.append(outcome.tier)
        kinds.append(type(module).__name__)
        a = np.arange(256, dtype="float32")
        out = tvm.runtime.tensor(np.zeros(256, "float32"))
        module[f"add_{i}"](tvm.runtime.tensor(a), out)
        if not np.array_equal(out.numpy(), a + i):
            wrong.append(i)
    return {"tiers": tiers, "wrong": wrong, "seconds": seconds, "modules": kinds, "pid": os.getpid(),
            "stats": cache.stats(shared=False).as_dict()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("first", type=int)
    parser.add_argument("count", type=int)
    parser.add_argument("--remote", required=True)
    parser.add_argument("--secret", default=None)
    parser.add_argument("--start-at", type=float, default=None, help="time.time() to start lowering at")
    parser.add_argument("--exit", choices=["normal", "os_exit", "wait"], default="normal")
    parser.add_argument("--lease-wait", type=float, default=None)
    parser.add_argument("--codegen", choices=["slow", "llvm"], default="slow")
    parser.add_argument("--flush-upgrades", action="store_true")
    parser.add_argument("--start-file", default=None, help="print a ready line, then start once this file exists")
    parser.add_argument("--hold-writer", action="store_true", help="the background writer starts no job meanwhile")
    args = parser.parse_args()
    held = contextlib.ExitStack()
    if args.hold_writer:
        held.enter_context(writer.hold())
    result = lower_range(args.directory, args.first, args.count, args.remote, args.secret, args.codegen,
                         args.lease_wait, args.start_at, args.start_file)
    cache = next(iter(_caches.values()))
    if args.flush_upgrades:
        result["flushed"] = cache.flush(120, upgrades=True)
    print(json.dumps(result), flush=True)
    if args.exit == "os_exit":
        # One more, and out right after it returns: its entry's push cannot have run.
        mod, target = variant(args.first + args.count)
        cache.lower(mod, target, codegen=SLOW_LLVM if args.codegen == "slow" else None)
        os._exit(0)  # no atexit, no writer drain
    if args.exit == "wait":
        time.sleep(600)  # until the test kills it
    held.close()
    cache.close()


if __name__ == "__main__":
    main()
