"""Section 2: hit latency against the number of entries in the store; key cost against IR size."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import xxhash
from alt_filecache import FileCache
from timing import interleave, linear_fit, summary

import codegen_cache as cc
from codegen_cache._artifacts import decode, frame
from codegen_cache._key import ir_hash

__all__ = ["fill_store", "key_cost", "store_scaling"]

SYNTHETIC_PAYLOAD = 1024  # bytes of "source" per synthetic entry (small CUDA kernels are 2-4 KiB)


def _synthetic(i: int) -> tuple[str, bytes]:
    key = xxhash.xxh3_128_hexdigest(f"synthetic-{i}".encode())
    meta = {"key": key, "codegen": "synthetic", "mode": "source", "build_seconds": 0.0}
    return key, frame("source", {**meta, "source_format": "cu"}, [os.urandom(SYNTHETIC_PAYLOAD // 2).hex().encode()])


def fill_store(cache: cc.CodegenCache, mode: str, count: int, batch: int = 5000) -> float:
    """Add `count` synthetic framed entries to a store; seconds taken.

    Writes go straight to the store's diskcache in transactions of `batch` rows: what matters
    for the benchmark is the number of rows the hit has to find its key among, not how they got
    there (a real fill through lower() would take hours of codegen).
    """
    t0 = time.perf_counter()
    store = cache.store(mode)
    disk = store._open()  # noqa: SLF001 - the diskcache.Cache under the store, for batched writes
    for start in range(0, count, batch):
        with disk.transact(retry=True):
            for i in range(start, min(count, start + batch)):
                key, blob = _synthetic(i)
                disk.set(key, blob)
    return time.perf_counter() - t0


def fill_files(files: FileCache, count: int) -> float:
    """Add `count` synthetic entries to the file cache; seconds taken."""
    t0 = time.perf_counter()
    for i in range(count):
        key, blob = _synthetic(i)
        files.put(key, blob)
    return time.perf_counter() - t0


def store_scaling(root: Path, cases: list[tuple[str, Any, Any, bool]], sizes: list[int], *,
                  files_max: int, reps: int, log=print) -> dict[str, Any]:
    """Disk-hit latency with `sizes` entries in the store, for each (label, mod, target, compiled) case.

    One directory per size, filled once; the hits of all sizes are timed in the same rounds.
    The file cache is filled to the same sizes up to `files_max`.
    """
    caches, files, fills = {}, {}, {}
    for n in sizes:
        d = Path(root) / f"n{n}"
        caches[n] = cc.CodegenCache(d / "cache", memory_entries=0, write_behind=False)
        fills[n] = {}
        for _label, _mod, _target, compiled in cases:
            mode = "compiled" if compiled else "source"
            if mode not in fills[n]:
                fills[n][mode] = fill_store(caches[n], mode, n - 1)
        if n <= files_max:
            files[n] = FileCache(d / "files")
            fills[n]["files"] = fill_files(files[n], n - 1)
        log(f"  filled {n} entries: " + ", ".join(f"{k} {v:.1f}s" for k, v in fills[n].items()))
    out: dict[str, Any] = {"sizes": sizes, "files_max": files_max, "fill_seconds": fills, "cases": []}
    for label, mod, target, compiled in cases:
        variants = {}
        for n, cache in caches.items():
            _, outcome = cache.lower_with_outcome(mod, target, compile_device=compiled)  # the real entry
            key = outcome.key
            # llvm: every size hits the shared library (the helper links it in the background;
            # unwaited, some sizes would hit the LLVM IR form and others not).
            cache.flush(timeout=600, upgrades=True)
            _, again = cache.lower_with_outcome(mod, target, compile_device=compiled)
            assert again.tier == "disk", again.tier
            variants[f"ours/{n}"] = (lambda c=cache: c.lower(mod, target, compile_device=compiled))
            if n in files:
                blob = cache.store("compiled" if compiled else "source").get(key)
                files[n].put(key, blob)
                scratch = str(Path(root) / "scratch")
                os.makedirs(scratch, exist_ok=True)
                variants[f"files/{n}"] = (
                    lambda f=files[n], c=cache: decode(
                        f.get(c.key_for(mod, target, compile_device=compiled).digest), scratch=scratch))
        times = interleave(variants, reps)
        row = {"case": label, "t": {k: summary(v) for k, v in times.items()}}
        lo, hi = sizes[0], sizes[-1]
        row["ratio"] = row["t"][f"ours/{hi}"]["median"] / row["t"][f"ours/{lo}"]["median"]
        top_files = max((n for n in files), default=None)
        if top_files is not None and top_files > lo:
            row["files_ratio"] = row["t"][f"files/{top_files}"]["median"] / row["t"][f"files/{lo}"]["median"]
        out["cases"].append(row)
    for cache in caches.values():
        cache.close()
    return out


def key_cost(root: Path, cases: dict[str, list[tuple[int, Any, Any]]], reps: int) -> dict[str, Any]:
    """Structural hash and full key cost per IR size; a line fitted per target (us per statement)."""
    cache = cc.CodegenCache(Path(root) / "keys")
    out: dict[str, Any] = {}
    for label, items in cases.items():
        variants = {}
        for n, mod, target in items:
            variants[f"hash/{n}"] = (lambda m=mod: ir_hash(m))
            variants[f"key/{n}"] = (lambda m=mod, t=target: cache.key_for(m, t, compile_device=False))
        times = interleave(variants, reps)
        sizes = [n for n, _, _ in items]
        med = {k: summary(v)["median"] for k, v in times.items()}
        fit = linear_fit([float(n) for n in sizes], [med[f"hash/{n}"] for n in sizes])
        out[label] = {
            "statements": sizes,
            "hash": [med[f"hash/{n}"] for n in sizes],
            "key": [med[f"key/{n}"] for n in sizes],
            "per_statement": [med[f"hash/{n}"] / n for n in sizes],
            "fit": fit,
        }
    return out
