"""Single-flight across processes: N processes lower the same cold keys at once.

    python benchmarks/bench_single_flight.py [--procs 4] [--keys 10] [--seconds 0.3]

Each key's codegen sleeps --seconds then builds llvm (tests/slow_codegen.py). Runs, side by
side: one process over the keys (cold), then --procs processes over the same keys in a fresh
cache directory, all starting at the same instant. Reports codegen calls per key and the wall
time of both; the goal is every key compiled once and a wall time about one process's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
WORKER = TESTS / "flight_worker.py"


def run(procs: int, keys: int, seconds: float, directory: Path, log: Path) -> dict:
    env = {**os.environ, "SLOW_CODEGEN_LOG": str(log), "SLOW_CODEGEN_SECONDS": str(seconds)}
    start_at = time.time() + 12.0  # after every worker has imported tvm (slow on a busy machine)
    workers = [
        subprocess.Popen([sys.executable, str(WORKER), str(directory), "0", str(keys), "--start-at", str(start_at)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(procs)
    ]
    results = []
    for w in workers:
        out, err = w.communicate(timeout=600)
        if w.returncode != 0:
            raise SystemExit(f"worker failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    late = max(r["started"] for r in results) - start_at
    calls = Counter(line.split()[1] for line in log.read_text().splitlines())
    return {
        "procs": procs,
        "wall_s": max(r["ended"] for r in results) - min(r["started"] for r in results),
        "codegen_calls": sum(calls.values()),
        "max_calls_per_key": max(calls.values()),
        "tiers": dict(Counter(t for r in results for t in r["tiers"])),
        "wrong_results": sum(len(r["wrong"]) for r in results),
        "start_skew_s": late,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        one = run(1, args.keys, args.seconds, root / "one", root / "one.log")
        many = run(args.procs, args.keys, args.seconds, root / "many", root / "many.log")
    print(f"{'processes':>9} {'wall s':>8} {'codegen calls':>14} {'max calls/key':>14} {'wrong':>6}  tiers")
    for r in (one, many):
        print(f"{r['procs']:>9} {r['wall_s']:>8.2f} {r['codegen_calls']:>14} {r['max_calls_per_key']:>14} "
              f"{r['wrong_results']:>6}  {r['tiers']}")
    ratio = many["wall_s"] / one["wall_s"]
    ok = many["max_calls_per_key"] == 1 and many["codegen_calls"] == args.keys and ratio < 1.5
    print(f"wall({args.procs} procs) / wall(1 proc) = {ratio:.2f}; each key compiled once: "
          f"{many['max_calls_per_key'] == 1} -> {'PASS' if ok else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"one": one, "many": many, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    from timing import compile_bytecode

    compile_bytecode()
    main()
