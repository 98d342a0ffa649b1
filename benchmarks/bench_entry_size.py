"""What a cold tvm.compile leaves in a cache directory, against the library TVM exports for it.

    python benchmarks/bench_entry_size.py [--layers 1 4 16] [--targets llvm cuda] [--json OUT.json]
    python benchmarks/bench_entry_size.py --levels     # zstd levels on a stored entry's LLVM IR

Per model (tests/relax_models.llama: hidden 256, seq 32) and target, a fresh interpreter
compiles the model twice: plain TVM, whose `export_library` file is the reference (what a user
keeps by hand: the host library, and for CUDA the device code packed into it), and through
codegen_cache.enable() on an empty directory, then waits for the writer and the llvm upgrader
(flush(upgrades=True)) and closes the cache. `cuda` is {"kind": "cuda", "arch": "sm_90"}: without a
CUDA driver (these machines) TVM makes source-only CUDA, and the reference packs that source.

The parent then counts, after the child exited, every row of every store of the directory: the
key, and the value (inline in SQLite, or its value file), split by what it holds: the llvm
shared library, its LLVM IR (zstd-packed), the model entry (relax-executable: the VM bytecode and the
constants), the build index entries, source and other entries. Entry bytes / reference bytes is
checked against 1.5 (PASS/FAIL). Besides, the directory's files as a whole once the upgrader
has exited: SQLite's own files (database pages, write-ahead log, shared memory: fixed costs per
store, not per entry), stats.sqlite and any counter file left in stats/, and anything else.

--levels times zstd at each level on the LLVM IR of a stored llvm entry (pack and unpack,
best of 5), and prints the sizes: the writer thread pays the packing once per miss.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
TARGETS = {"llvm": "llvm", "cuda": '{"kind": "cuda", "arch": "sm_90"}'}
GOAL = 1.5

_CHILD = r"""
import json, os, sys
sys.path.insert(0, {tests!r})
import tvm
import codegen_cache as cc
import relax_models
layers, target, directory, out = {layers}, tvm.target.Target({target!r}), {directory!r}, {out!r}
mod, _ = relax_models.llama(layers)
tvm.compile(mod, target).export_library(out)
cache = cc.CodegenCache(directory)
cc.enable()
with cc.use_cache(cache):
    mod, _ = relax_models.llama(layers)
    tvm.compile(mod, target)
    assert cache.flush(300, upgrades=True)
cache.close()
cc.disable()
"""


def _entry_parts(blob: bytes) -> dict[str, int]:
    """Bytes of one stored value by what they hold."""
    from codegen_cache._artifacts import unframe
    from codegen_cache._errors import ArtifactError

    try:
        art = unframe(blob)
    except ArtifactError:
        return {"unreadable": len(blob)}
    frame_bytes = len(blob) - sum(len(f) for f in art.fields)
    if art.codec == "llvm-so":
        parts = {"llvm library": len(art.fields[0]), "llvm IR": len(art.fields[1])}
    elif art.codec == "llvm-ir":
        parts = {"llvm IR (not linked)": len(art.fields[0])}
    elif art.codec == "relax-executable":
        parts = {"model entry": sum(len(f) for f in art.fields)}
    elif art.codec == "build-index":
        parts = {"build index": 0}
    else:
        parts = {f"{art.codec} payload": sum(len(f) for f in art.fields)}
    parts["frames and metadata"] = frame_bytes
    return parts


def count_entries(directory: Path) -> dict[str, int]:
    """Bytes of every store row of `directory` by part (keys and values, inline or in a value file)."""
    parts: dict[str, int] = {}
    for db in sorted(directory.glob("*/cache.db")):
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = connection.execute("SELECT key, filename, value FROM Cache").fetchall()
        finally:
            connection.close()
        for key, filename, value in rows:
            blob = (db.parent / filename).read_bytes() if filename else bytes(value or b"")
            parts["keys"] = parts.get("keys", 0) + len(key if isinstance(key, bytes) else str(key).encode())
            for name, size in _entry_parts(blob).items():
                parts[name] = parts.get(name, 0) + size
    return parts


def count_files(directory: Path) -> dict[str, int]:
    """Bytes of every file under `directory` by kind."""
    kinds: dict[str, int] = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = Path(root, name)
            rel = path.relative_to(directory)
            if name.startswith("cache.db"):
                kind = "SQLite files"
            elif name.endswith(".val"):
                kind = "value files"
            elif len(rel.parts) == 1:
                kind = name
            else:
                kind = f"{rel.parts[0]}/ files"
            kinds[kind] = kinds.get(kind, 0) + path.stat().st_size
            kinds[kind + " (count)"] = kinds.get(kind + " (count)", 0) + 1
    return kinds


def _settle(directory: Path, timeout: float = 60.0) -> None:
    """Until the llvm upgrader the child started has exited (it counts, and folds its counts as it exits)."""
    from codegen_cache._cache._upgrade import wait_exited

    wait_exited(directory, timeout)
    deadline = time.monotonic() + 5.0
    while any((directory / "stats").glob("*.cnt")) and time.monotonic() < deadline:
        time.sleep(0.05)


def measure(layers: int, target: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix="cgc-size-"))
    try:
        directory, ref = work / "cache", work / "reference.so"
        code = _CHILD.format(tests=str(TESTS), layers=layers, target=TARGETS[target], directory=str(directory),
                             out=str(ref))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODEGEN_CACHE_")}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"child failed for {layers} layers on {target}:\n{done.stderr[-2000:]}")
        _settle(directory)
        entries, files = count_entries(directory), count_files(directory)
        return {"layers": layers, "target": target, "reference": ref.stat().st_size, "entries": entries,
                "entry_bytes": sum(entries.values()), "files": files}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def levels(layers: int) -> list[dict]:
    """zstd at each level on the LLVM IR of `layers` layers' llvm entry: sizes and times."""
    import zstandard

    from codegen_cache._artifacts import _packed, unframe

    work = Path(tempfile.mkdtemp(prefix="cgc-size-"))
    try:
        directory = work / "cache"
        code = _CHILD.format(tests=str(TESTS), layers=layers, target="llvm", directory=str(directory),
                             out=str(work / "reference.so"))
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=1800)
        blob = max(directory.glob("compiled/*/*/*.val"), key=lambda p: p.stat().st_size).read_bytes()
        text = bytes(_packed.unpack(unframe(blob).fields[1]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for level in (1, 2, 3, 4, 6, 9, 12, 15, 19):
        compressor, best_pack, best_unpack = zstandard.ZstdCompressor(level=level), float("inf"), float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            packed = compressor.compress(text)
            t1 = time.perf_counter()
            zstandard.ZstdDecompressor().decompress(packed)
            best_pack, best_unpack = min(best_pack, t1 - t0), min(best_unpack, time.perf_counter() - t1)
        rows.append({"level": level, "text": len(text), "packed": len(packed), "pack_s": best_pack,
                     "unpack_s": best_unpack})
    return rows


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--targets", nargs="+", choices=sorted(TARGETS), default=["llvm", "cuda"])
    parser.add_argument("--levels", action="store_true", help="zstd levels on a stored entry's LLVM IR")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
    if args.levels:
        rows = levels(args.layers[0])
        print(f"zstd on the LLVM IR of the {args.layers[0]}-layer model ({_kb(rows[0]['text'])}), best of 5:")
        for row in rows:
            print(f"  level {row['level']}: {_kb(row['packed'])} ({row['text'] / row['packed']:.1f}x), "
                  f"pack {row['pack_s'] * 1e3:.1f} ms, unpack {row['unpack_s'] * 1e3:.2f} ms")
        results: list[dict] = rows
    else:
        results, failed = [], 0
        for target in args.targets:
            for layers in args.layers:
                found = measure(layers, target)
                results.append(found)
                ratio = found["entry_bytes"] / found["reference"]
                verdict = "PASS" if ratio <= GOAL else "FAIL"
                failed += verdict == "FAIL"
                print(f"{target} {layers:>2} layers: entries {_kb(found['entry_bytes'])}, exported library "
                      f"{_kb(found['reference'])}, ratio {ratio:.2f}x  {verdict} (goal <= {GOAL}x)")
                for name, size in sorted(found["entries"].items(), key=lambda kv: -kv[1]):
                    print(f"    {name:<24} {_kb(size):>12}")
                files = found["files"]
                print("    directory after exit: " + ", ".join(
                    f"{kind} {_kb(size)} ({files.get(kind + ' (count)', 0)})"
                    for kind, size in sorted(files.items()) if not kind.endswith("(count)")))
        print("all PASS" if not failed else f"{failed} FAIL")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
