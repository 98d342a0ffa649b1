"""What loading the checked bytes costs an llvm disk hit (issue 23), side by side in one process.

    python benchmarks/bench_checked_load.py [--rounds 1500]

For the llvm vector add and matmul, linked into shared libraries (as a later run finds them),
interleaved rounds (timing.interleave) of:
- "disk hit": CodegenCache(memory_entries=0).lower(), which loads a private copy of the bytes
  it read and checked (a sealed memfd, _artifacts/_private.py);
- "floor": TVM's hash + sqlite3/pread of the stored bytes + TVM's load of a file that exists
  (benchmarks/floor.py, as run.py's section 1);
- "load in place": TVM's loader on the library's own file (what a hit did before issue 23:
  dlopen where the value file lies, no copy);
- "load private copy": load_private_copy of the library's bytes (what a hit does now: the
  sealed copy made at the first load in a process is kept and mapped again);
- "first private copy": the same where no copy is kept yet (the first hit of an entry in a
  process: a new memfd written from the bytes).
The differences to "load in place" are what the guarantee costs a hit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernels  # noqa: E402
import tvm_ffi  # noqa: E402
from floor import RawStore, floor_loader, tvm_hash  # noqa: E402
from timing import fmt_ratio, fmt_time, interleave  # noqa: E402

import codegen_cache as cc  # noqa: E402
from codegen_cache._artifacts import unframe  # noqa: E402
from codegen_cache._artifacts import _private  # noqa: E402
from codegen_cache._artifacts._private import load_private_copy  # noqa: E402

_LOAD = tvm_ffi.get_global_func("ffi.Module.load_from_file.so")


def measure(name: str, mod, target, rounds: int, workdir: str) -> dict[str, float]:
    """Medians (seconds) of the four variants, and the per-round disk/floor ratio."""
    directory = Path(workdir) / name
    writer = cc.CodegenCache(directory, write_behind=False)
    writer.lower(mod, target)
    assert writer.flush(upgrades=True, timeout=600), "the entry was not linked"
    digest = writer.key_for(mod, target).digest
    blob = writer.store("compiled").get(digest)
    art = unframe(blob)
    assert art.codec == "llvm-so", art.codec
    library = bytes(art.fields[0])
    own_file = directory / "tmp" / f"{name}-in-place.so"  # the library's own file, as a value file held it
    own_file.write_bytes(library)
    scratch = str(directory / "tmp")
    raw = RawStore(directory / "compiled")
    _codec, floor_load = floor_loader(blob, scratch)
    cache = cc.CodegenCache(directory, memory_entries=0)

    def floor():
        tvm_hash(mod)
        floor_load(raw.read(digest))

    def forget_copies():  # untimed, before "first private copy": no sealed copy is kept
        while _private._kept:
            os.close(_private._kept.popitem()[1][1])

    private = (lambda: load_private_copy(library, scratch, lambda path: _LOAD(path, "so")))
    times = interleave({
        "disk hit": lambda: cache.lower(mod, target),
        "floor": floor,
        "load in place": lambda: _LOAD(str(own_file), "so"),
        "load private copy": private,
        "first private copy": (private, forget_copies),
    }, rounds, warmup=20)
    found = {k: statistics.median(v) for k, v in times.items()}
    found["disk/floor"] = statistics.median(d / f for d, f in zip(times["disk hit"], times["floor"]))
    found["library bytes"] = len(library)
    raw.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1500)
    args = parser.parse_args()
    cases = {"vadd": kernels.vadd(), "matmul": kernels.matmul()}
    print(f"{'kernel':<8}{'library':>9}{'disk hit':>10}{'floor':>9}{'disk/floor':>12}"
          f"{'in place':>10}{'private':>9}{'first':>8}{'private-in place':>18}{'first-in place':>16}")
    with tempfile.TemporaryDirectory(prefix="cgc-bench-") as workdir:
        for name, func in cases.items():
            mod, target = cc.prepare_for_codegen(func, "llvm")
            r = measure(name, mod, target, args.rounds, workdir)
            extra = r["load private copy"] - r["load in place"]
            first = r["first private copy"] - r["load in place"]
            print(f"{name:<8}{r['library bytes'] / 1024:>8.1f}K{fmt_time(r['disk hit']):>10}{fmt_time(r['floor']):>9}"
                  f"{fmt_ratio(r['disk/floor']):>12}{fmt_time(r['load in place']):>10}"
                  f"{fmt_time(r['load private copy']):>9}{fmt_time(r['first private copy']):>8}"
                  f"{'+' + fmt_time(extra):>18}{'+' + fmt_time(first):>16}")
            cc.CodegenCache(Path(workdir) / name).flush(upgrades=True, timeout=60)
    print(f"medians of {args.rounds} interleaved rounds; pid {os.getpid()}")


if __name__ == "__main__":
    main()
