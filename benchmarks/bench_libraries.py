"""The hand-written parts against the library the field would use, side by side (docs/architecture.md).

    python benchmarks/bench_libraries.py [--rounds 31]

Each group runs its variants interleaved (one call of each per round, order shuffled) and
prints the median per call:

- build lock of a new key, uncontended, taken and released (what every miss pays): our
  KeyLocks (a byte of one shared file, OFD locks, and the holder's marker), the same without
  the marker, our fallback (flock on a file per key, made and removed), filelock.FileLock on a file per key (needs `pip install filelock`);
- staging an entry before lower() returns (4 KiB and 256 KiB): PendingFiles.write into a spare
  file made ahead, PendingFiles.write making its file, diskcache's own `Cache.set` straight
  into the store on the caller's thread;
- a remote GET and SET of one entry (4 KiB and 1 MiB) on a private redis-server on loopback:
  our RESP2 client against redis-py's `Redis` (needs redis-server on PATH and `redis`);
- an llvm entry on the caller's path (the 1024-element vector add): its LLVM IR text (what
  lower() stores, the upgrader linking it later) against TVM's `export_library` (object file
  and link, what storing a shared library in the user's process would cost), and what upgrading
  it costs the machine in a fresh helper process: as the upgrader does it (TVM's libraries
  through tvm-ffi's C ABI) against the same after `import tvm`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import compile_bytecode, interleave


def show(group: str, samples: dict[str, list[float]]) -> None:
    print(f"{group}:")
    for name, xs in samples.items():
        print(f"  {name:<34} {statistics.median(xs) * 1e6:9.1f} us")


def locks(rounds: int, tmp: Path) -> None:
    from codegen_cache._storage._locks import KeyLocks
    ours, per_file = KeyLocks(tmp / "a" / "locks"), KeyLocks(tmp / "b" / "locks")
    per_file._ranges = -1  # the fallback: a flock file per key
    counter = iter(range(10 ** 9))

    def key() -> str:
        return f"{next(counter):032x}"

    def with_ours(locks=ours):
        locks.release(locks.acquire(key(), wait=1.0))

    from codegen_cache._storage import _locks

    def without_marker():  # what the holder's marker (a classic lock naming its pid) costs a miss
        mark, _locks.mark = _locks.mark, lambda *args: None
        try:
            with_ours()
        finally:
            _locks.mark = mark

    variants = {"ours (byte of one file, OFD)": with_ours,
                "ours, without the holder's marker": without_marker,
                "ours, fallback (flock file per key)": lambda: with_ours(per_file)}
    try:
        import filelock
    except ImportError:
        print("  (filelock not installed: pip install filelock)")
    else:
        root = tmp / "c" / "locks"
        root.mkdir(parents=True)

        def with_filelock():
            lock = filelock.FileLock(str(root / key()), is_singleton=False)
            with lock:
                pass
        variants[f"filelock {filelock.__version__} (file per key)"] = with_filelock
    show("build lock of a new key, acquire + release", interleave(variants, rounds, warmup=3))


def staging(rounds: int, tmp: Path) -> None:
    import diskcache

    from codegen_cache._storage._safedisk import SafeDisk
    from codegen_cache._storage._pending import PendingFiles
    for size in (4 << 10, 256 << 10):
        root = tmp / f"s{size}"
        spare, fresh = PendingFiles(root / "pending" / "a"), PendingFiles(root / "pending" / "b")
        store = diskcache.Cache(str(root / "compiled"), disk=SafeDisk, statistics=False)
        show(f"staging a {size >> 10} KiB entry", interleave(_staging_variants(spare, fresh, store, os.urandom(size)),
                                                             rounds, warmup=3))
        store.close()


def _staging_variants(spare, fresh, store, blob: bytes) -> dict:
    counter = iter(range(10 ** 9))
    return {
        "PendingFiles.write, spare file ready": (lambda: spare.write(f"{next(counter):032x}", blob), spare.keep_spare),
        "PendingFiles.write, making its file": lambda: fresh.write(f"{next(counter):032x}", blob),
        "diskcache Cache.set (caller's thread)": lambda: store.set(f"{next(counter):032x}", blob),
    }


def remote(rounds: int, tmp: Path) -> None:
    import shutil
    if shutil.which("redis-server") is None:
        print("remote: skipped (redis-server is not on PATH)")
        return
    try:
        import redis
    except ImportError:
        print("remote: skipped (redis-py is not installed: pip install redis)")
        return
    from redis_server import RedisServer

    from codegen_cache._storage._client import RespClient
    from codegen_cache._storage._endpoint import Endpoint
    server = RedisServer(tmp / "redis")
    try:
        ours = RespClient(Endpoint.from_url(server.url, 2.0))
        theirs = redis.Redis.from_url(server.url, socket_timeout=2.0)
        for size in (4 << 10, 1 << 20):
            value, key = os.urandom(size), f"bench:{size}".encode()
            ours.set(key, value, None)
            samples = interleave(_remote_variants(ours, theirs, redis.__version__, key, value), rounds, warmup=3)
            assert ours.get(key, 64 << 20) == value and theirs.get(key) == value
            show(f"remote, a {size >> 10} KiB value", samples)
        ours.close()
        theirs.close()
    finally:
        server.stop()


def _remote_variants(ours, theirs, version: str, key: bytes, value: bytes) -> dict:
    return {
        "ours GET": lambda: ours.get(key, 64 << 20),
        f"redis-py {version} GET": lambda: theirs.get(key),
        "ours SET": lambda: ours.set(key + b":w", value, 60_000),
        f"redis-py {version} SET": lambda: theirs.set(key + b":w", value, px=60_000),
    }


def llvm_entry(rounds: int, tmp: Path) -> None:
    import subprocess

    import kernels

    import codegen_cache as cc
    mod, target = cc.prepare_for_codegen(kernels.vadd(), "llvm")
    with cc.use_cache(None):
        built = cc.resolve_device_codegen(target).lower(mod, target, compile_device=True)
    counter = iter(range(10 ** 9))
    variants = {"LLVM IR text (inspect_source('ll'))": lambda: built.inspect_source("ll"),
                "export_library (.o + link)": lambda: built.export_library(str(tmp / f"lib{next(counter)}.so"))}
    show("an llvm entry on the caller's path", interleave(variants, max(5, rounds // 3), warmup=1))
    upgrader_start(built, tmp)


def upgrader_start(built, tmp: Path) -> None:
    """One entry upgraded in a fresh helper process: as the upgrader does it (TVM's libraries through
    tvm-ffi's C ABI) against the same work after `import tvm` (TVM's Python API). Interleaved, medians
    of 5; wall time and the child's CPU time (user + system)."""
    import resource
    import subprocess

    from codegen_cache._artifacts import encode
    from codegen_cache._compat import host_llvm_triple
    from codegen_cache._compat._abi import tvm_libraries

    blob = tmp / "entry"
    blob.write_bytes(encode(built, {"key": "k"}, func_names=["vadd"]))
    abi = ("import sys\nfrom codegen_cache._artifacts._link import upgrade\n"
           "assert upgrade(open(sys.argv[1], 'rb').read(), sys.argv[2], host_triple=sys.argv[3], libraries=sys.argv[4:])")
    api = ("import sys, tvm\nfrom codegen_cache._artifacts._link import upgrade\n"
           "from codegen_cache._compat._abi import tvm_libraries\n"
           "assert upgrade(open(sys.argv[1], 'rb').read(), sys.argv[2], host_triple=sys.argv[3], libraries=tvm_libraries())")
    args = [str(blob), str(tmp), host_llvm_triple(), *tvm_libraries()]
    times: dict[str, list[tuple[float, float]]] = {"C ABI (the upgrader)": [], "after import tvm": []}
    for _ in range(5):
        for name, code in (("C ABI (the upgrader)", abi), ("after import tvm", api)):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-I", "-c", code, *args], check=True)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            times[name].append((wall, cpu))
    print("one entry upgraded in a fresh helper process (median of 5: wall, CPU)")
    for name, got in times.items():
        wall = statistics.median(w for w, _ in got) * 1e3
        cpu = statistics.median(c for _, c in got) * 1e3
        print(f"  {name:<34} {wall:9.1f} ms wall {cpu:9.1f} ms CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        locks(args.rounds, Path(tmp))
        staging(args.rounds, Path(tmp))
        remote(args.rounds, Path(tmp))
        llvm_entry(args.rounds, Path(tmp))
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    compile_bytecode()
    main()
