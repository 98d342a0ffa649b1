"""What each use of another library's private API buys: the private way against the public one.

    python benchmarks/bench_private.py [--rounds 15]

Each pair runs side by side, interleaved (one batch of each per round, order shuffled), and
prints the median per call of each and their difference. The pairs:

- env: the CUDA codegen's environment reads (cuda.COMPILE_ENV) through os.environ's private
  dict `_data` and encoded names, against `os.environ.get`;
- convert: wrapping a Python function, first call in a fresh process (what _pyfunc's layout
  probe pays once), `tvm_ffi.core._convert_to_ffi_func` against `tvm_ffi.convert_func` and
  `tvm_ffi.convert` (medians of fresh processes);
- target: a Target from JSON text, first call in a fresh process (_compat.target_from_json),
  through `tvm.target._ffi_api.Target`, through the public `tvm.get_global_func("target.Target")`
  (the same function) and through `Target(text)` (medians of fresh processes);
- row read: the SELECT of a small entry's row through diskcache's private `Cache._sql` against
  the store's own plain SQLite connection (what ArtifactStore.read now uses);
- value file write: a 1 MiB value put into a store through SafeDisk (its own `_write`: one
  chunk) against diskcache's `Disk._write` (a BytesIO written line by line).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import compile_bytecode, interleave

_TARGET = r"""
import json, sys, time, tvm
text = json.dumps({"kind": "cuda", "arch": "sm_90"})
how = sys.argv[1]
make = {"private": lambda: tvm.target._ffi_api.Target, "global func": lambda: tvm.get_global_func("target.Target"),
        "Target()": lambda: tvm.target.Target}[how]()
t0 = time.perf_counter(); make(text); print(time.perf_counter() - t0)
"""

_CONVERT = r"""
import sys, time, tvm_ffi
def f():
    return 1
how = sys.argv[1]
wrap = {"private": lambda: tvm_ffi.core._convert_to_ffi_func, "convert_func": lambda: tvm_ffi.convert_func,
        "convert": lambda: tvm_ffi.convert}[how]()
t0 = time.perf_counter(); wrap(f); print(time.perf_counter() - t0)
"""


def batched(fn, number):
    def run():
        for _ in range(number):
            fn()
    return run


def per_call(samples: dict[str, list[float]], number: int) -> dict[str, float]:
    return {name: statistics.median(xs) / number for name, xs in samples.items()}


def show(title: str, medians: dict[str, float]) -> None:
    (a, ta), (b, tb) = medians.items()
    print(f"{title:<18} {a} {ta * 1e6:8.3f} us   {b} {tb * 1e6:8.3f} us   difference {(tb - ta) * 1e6:+8.3f} us")


def env_pair(rounds: int) -> None:
    from codegen_cache.codegens import cuda
    names = tuple(cuda.COMPILE_ENV)
    raw, encode = os.environ._data, os.environ.encodekey  # the private way, as _common.py did
    encoded = tuple(map(encode, names))
    number = 20000
    samples = interleave({"private": batched(lambda: tuple(map(raw.get, encoded)), number),
                          "public": batched(lambda: tuple(map(os.environ.get, names)), number)}, rounds)
    show(f"env ({len(names)} names)", per_call(samples, number))


def first_calls(title: str, script: str, hows: tuple[str, ...], rounds: int) -> None:
    """Each way's first call, timed in fresh processes (their order rotated); medians."""
    times: dict[str, list[float]] = {h: [] for h in hows}
    for r in range(max(5, rounds // 2)):
        for how in hows[r % len(hows):] + hows[:r % len(hows)]:
            out = subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True, check=True)
            times[how].append(float(out.stdout))
    medians = {h: statistics.median(xs) for h, xs in times.items()}
    print(f"{title:<18} " + "   ".join(f"{h} {t * 1e6:8.1f} us" for h, t in medians.items()))


def convert_pair(rounds: int) -> None:
    first_calls("convert (first)", _CONVERT, ("private", "convert_func", "convert"), rounds)


def target_pair(rounds: int) -> None:
    first_calls("target (first)", _TARGET, ("private", "global func", "Target()"), rounds)


def write_pair(rounds: int) -> None:
    import diskcache

    from codegen_cache._storage._safedisk import SafeDisk

    class PlainWrite(SafeDisk):
        _write = diskcache.Disk._write  # diskcache's own: makedirs, a BytesIO written line by line

    blob = os.urandom(1 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        stores = {name: diskcache.Cache(os.path.join(tmp, name), disk=disk, statistics=False)
                  for name, disk in (("SafeDisk", SafeDisk), ("diskcache", PlainWrite))}
        counter = iter(range(10 ** 9))
        samples = interleave({name: lambda s=store: s.set(f"k{next(counter)}", blob)
                              for name, store in stores.items()}, rounds)
        for store in stores.values():
            store.close()
    show("1 MiB value write", per_call(samples, 1))


def row_pair(rounds: int) -> None:
    from codegen_cache._storage import _disk
    with tempfile.TemporaryDirectory() as tmp:
        store = _disk.ArtifactStore(Path(tmp) / "compiled", size_limit=1 << 30)
        store.put("k", b"x" * 2000)
        cache = store._cache  # diskcache's Cache, open in this process
        assert store.get("k") == b"x" * 2000 and store._reader is not None
        reader = store._reader  # the store's own plain SQLite connection

        def private():
            return cache._sql(_disk._SELECT, ("k", time.time())).fetchone()

        def public():
            return reader.execute(_disk._SELECT, ("k", time.time())).fetchone()

        assert private() == public()
        number = 2000
        samples = interleave({"Cache._sql": batched(private, number),
                              "own connection": batched(public, number)}, rounds)
        store.close()
    show("row read", per_call(samples, number))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    started = time.perf_counter()
    for pair in (env_pair, row_pair, write_pair, convert_pair, target_pair):
        pair(args.rounds)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    compile_bytecode()
    main()
