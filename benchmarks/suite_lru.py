"""Marking use on a hit (LRU eviction) against the same hit without marking, interleaved.

    python -m benchmarks.suite_lru [--rounds 15]

Each row times one kind of hit through a cache that marks use (what every cache does) and
through a second cache on the same directory whose marks go nowhere (the floor), batch by
batch in alternation, and reports the medians: ratio = median / floor.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

DESCRIPTION = "a hit that marks its entry used (LRU eviction) against the same hit without marking"

_BATCH = {"memory": 2000, "disk": 200}
_GOAL = 1.05  # marking may add at most 5% to a hit


class _NoMarks:
    """Marks that go nowhere: the floor's cache marks nothing."""

    def mark(self, store: str, key: str) -> None:
        pass

    def write(self) -> int:
        return 0


def _caches(directory: str, memory: bool):
    import codegen_cache as cc

    entries = 512 if memory else 0  # 0: every hit is a disk hit
    marking = cc.CodegenCache(directory, min_codegen_time=0, memory_entries=entries)
    floor = cc.CodegenCache(directory, min_codegen_time=0, memory_entries=entries)
    floor.__dict__["_marks"] = _NoMarks()  # before its first lowering: its disk tier takes this one
    return marking, floor


def _per_hit(cache, mod, target, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        cache.lower(mod, target)
    return (time.perf_counter() - start) / number


def run(rounds: int) -> list[dict]:
    """One row per kind of hit (memory, disk): the median per hit with marking, its floor, their ratio."""
    import codegen_cache as cc
    from benchmarks import kernels  # this directory's (tests/ has a kernels module too)

    mod, target = cc.prepare_for_codegen(kernels.vadd(), "llvm")  # benchmarks/kernels.py
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        seed = cc.CodegenCache(directory, min_codegen_time=0, write_behind=False)
        seed.lower(mod, target)
        seed.close()
        for tier in ("memory", "disk"):
            marking, floor = _caches(directory, tier == "memory")
            for cache in (marking, floor):  # warm up: the first hit loads the library, fills memory
                cache.lower(mod, target)
            timed: dict[str, list[float]] = {"marking": [], "floor": []}
            for _ in range(rounds):
                for name, cache in (("marking", marking), ("floor", floor)):
                    timed[name].append(_per_hit(cache, mod, target, _BATCH[tier]))
            for cache in (marking, floor):
                cache.close()
            median, base = statistics.median(timed["marking"]), statistics.median(timed["floor"])
            ratio = median / base
            rows.append({"name": f"llvm vector add, {tier} hit, marking use", "median": median * 1e6, "unit": "us",
                         "floor": base * 1e6, "ratio": ratio, "goal": f"<= {_GOAL}", "ok": ratio <= _GOAL,
                         "note": f"floor: the same {tier} hit without marking; {rounds} interleaved batches of "
                                 f"{_BATCH[tier]}"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    for row in run(args.rounds):
        print(f"{row['name']:<44} {row['median']:8.2f} {row['unit']}  floor {row['floor']:8.2f}  "
              f"ratio {row['ratio']:.3f} (goal {row['goal']}: {'ok' if row['ok'] else 'OVER'})  {row['note']}")


if __name__ == "__main__":
    main()
