"""The kernel hit engine of suite_hits: hit vs floor vs cold, miss overhead, the alternative, scaling.

Every variant of one case is timed in the same rounds, interleaved (timing.interleave), so the
ratios hold on a noisy machine. Cold builds use a fresh key each time: a copy of the codegen
with another salt (the salt is a key part; the build work is identical).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
import xxhash
from floor import RawStore, floor_loader, tvm_hash
from timing import interleave, percentile, summary

import codegen_cache as cc
from codegen_cache import CodegenCache, DeviceCodegen
from codegen_cache._artifacts import decode, encode, frame, unframe
from codegen_cache._cache._budget import LEARN_RUNS
from codegen_cache._key import ir_hash

__all__ = ["FileCache", "HitBench", "fill_store", "func_names", "store_scaling"]


def func_names(mod) -> list[str]:
    """Sorted global symbols of an IRModule's functions (what the cache records)."""
    names = []
    for gv, func in mod.functions.items():
        symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
        names.append(str(symbol) if symbol is not None else gv.name_hint)
    return sorted(names)


def _warmup_codegen() -> DeviceCodegen:
    # A codegen that costs nothing: lowering with it opens every store and the lease table once,
    # so no measured call pays for creating or opening an SQLite database.
    def build(mod, target):
        return tvm.get_global_func("runtime.SourceModuleCreate")("// warm-up", "cu")

    return DeviceCodegen("bench-warmup", build=build, build_without_compile=build)


def _hot_kwargs() -> dict:
    """unframe's keywords for what a hit parses: the hot metadata only, where it has that choice."""
    import inspect

    return {"info": False} if "info" in inspect.signature(unframe).parameters else {}


def _equal_copy(mod):
    """A structurally equal IRModule that is a different object (a re-lowered kernel), or None."""
    try:
        copy = tvm.ir.load_json(tvm.ir.save_json(mod))
    except (RuntimeError, ValueError):
        return None
    if copy.same_as(mod) or not tvm_ffi.structural_equal(copy, mod, map_free_vars=True):
        return None
    return copy


def ir_hash_cost(mod) -> float:
    """Seconds one structural hash of `mod` takes (a rough, single timing)."""
    t0 = time.perf_counter()
    ir_hash(mod)
    return time.perf_counter() - t0


def _paired(hits: dict[str, list[float]], disk: str, floor: str, memory: str, hash_: str) -> dict[str, float]:
    """Ratios and differences taken round by round (both variants ran in the same round).

    `mem_over_hash_resolution` is the IQR of the per-round differences over sqrt(rounds): a
    rough size of what the median difference can resolve at this machine's noise.
    """
    out: dict[str, float] = {}
    if hits.get(disk) and hits.get(floor):
        out["disk_floor"] = statistics.median(d / f for d, f in zip(hits[disk], hits[floor]))
    if hits.get(memory) and hits.get(hash_):
        diffs = [m - h for m, h in zip(hits[memory], hits[hash_])]
        out["mem_over_hash"] = statistics.median(diffs)
        out["mem_over_hash_resolution"] = (percentile(diffs, 75) - percentile(diffs, 25)) / math.sqrt(len(diffs))
    return out


class HitBench:
    """Caches shared by every case of one run: miss (fills), disk-only, memory, remote, file cache."""

    def __init__(self, root: Path, *, remote_url: str | None = None) -> None:
        self.root = Path(root)
        hits = self.root / "hits"
        # The first cold miss of each case uses the real key, so it also stores the entry that
        # the hit variants read (no extra build); later misses use salted keys.
        # These measure the tiers themselves: every entry in every tier (min_codegen_time=0).
        self.miss = CodegenCache(hits, min_codegen_time=0)  # write-behind, the default
        self.disk = CodegenCache(hits, memory_entries=0, min_codegen_time=0)
        # The memory variant has a directory of its own: a module it holds keeps its shared
        # library mapped, and a disk hit on that same file would then find it loaded (a 2 us
        # lookup instead of a 40 us load), which neither the floor nor a fresh process gets.
        self.mem = CodegenCache(self.root / "mem", min_codegen_time=0)
        # The cache as a user gets it (min_codegen_time auto): one object for every case,
        # as one process lowering many kernels; it learns each codegen's tiers from its calls.
        self.auto = CodegenCache(self.root / "auto", min_codegen_time="auto")
        self.files = FileCache(self.root / "files")
        self.scratch = str(hits / "tmp")
        Path(self.scratch).mkdir(parents=True, exist_ok=True)
        self.remote_fill = self.remote = None
        if remote_url:
            from codegen_cache._storage._remote import RedisTier

            self.remote_fill = RedisTier(remote_url)  # puts the stored bytes, as another host would
            self.remote = CodegenCache(self.root / "remote", remote=remote_url, memory_entries=0, min_codegen_time=0)
        self._salts = itertools.count()
        self._learnt: set[tuple[str, str]] = set()  # (codegen, mode) the auto cache has learnt
        self._stored = itertools.count()
        self._warm()

    def caches(self) -> list[CodegenCache]:
        """Every CodegenCache of this bench."""
        return [c for c in (self.miss, self.disk, self.mem, self.remote, self.auto) if c is not None]

    def _warm(self) -> None:
        warm = _warmup_codegen()
        mod = tvm.IRModule({})
        for cache in self.caches():
            for compiled in (True, False):
                cache.lower(mod, "llvm", compile_device=compiled, codegen=warm)
            cache.flush()

    def close(self) -> None:
        """Flush and close every cache."""
        for cache in self.caches():
            cache.close()
        if self.remote_fill is not None:
            self.remote_fill.close()

    def salted(self, entry: DeviceCodegen) -> DeviceCodegen:
        """`entry` with a salt never used before: the same build under a fresh key."""
        return dataclasses.replace(entry, salt=f"bench-cold-{next(self._salts)}")

    def measure(self, kernel: str, codegen: str, mod, target, compile_device: bool, *,
                cold_budget: float, hit_budget: float, min_hit_reps: int = 5, max_hit_reps: int = 200,
                copy_max_hash: float = 10.0, jit_max_build: float = 60.0, load: bool = True,
                build=None) -> dict[str, Any]:
        """All timings of one case. `load=False`: the module cannot be loaded here (no CUDA
        driver): hits are then key + read + unframe. `build` overrides the bare codegen."""
        mode = "compiled" if compile_device else "source"
        entry = self.miss.resolve(target)
        bare_fn = build or (entry.build if compile_device else entry.build_without_compile)
        row: dict[str, Any] = {"kernel": kernel, "codegen": codegen, "target": str(target.kind.name),
                               "mode": mode, "functions": len(mod.functions), "loaded": load}

        # Toolchain salts are computed once per process (nvcc --version takes ~0.5 s): not a miss cost.
        self.miss.key_for(mod, target, compile_device=compile_device)

        # ---- cold: the bare codegen against a miss through the cache (caller-visible) -------
        cold: dict[str, list[float]] = {"bare": [], "miss": [], "bg_store": [], "auto_miss": [], "auto_key": [],
                                        "auto_after": []}
        keys: list[str] = []
        tiers: list[str] = []
        auto_tiers: list[str] = []
        rounds: dict[str, list[float]] = {"miss": [], "auto_miss": []}  # per loop round: the call - bare

        def bare():
            t0 = time.perf_counter()
            module = bare_fn(mod, target)
            cold["bare"].append(time.perf_counter() - t0)
            return module

        def miss() -> None:
            # The first miss uses the real key: it stores the entry the hits read. Later ones are salted.
            codegen = self.salted(entry) if keys else entry
            # Untimed: the key's codegen/target part for this new salt (memoized per codegen and
            # target, so a real miss finds it; only the salt trick makes it new here).
            self.miss.key_for(mod, target, compile_device=compile_device, codegen=codegen)
            t0 = time.perf_counter()
            if load:
                _, outcome = self.miss.lower_with_outcome(mod, target, compile_device=compile_device, codegen=codegen)
                tiers.append(outcome.tier)
                keys.append(outcome.key)
            else:  # no driver: the cache's compile-and-store path for GPU-less hosts
                keys.append(self.miss.precompile_cuda(mod, target, codegen=codegen))
            t1 = time.perf_counter()
            # The write-behind store: off the caller's path, but not free. For llvm it includes
            # the helper process that links the shared library: left running, it would share
            # the two cores with the next timed calls.
            self.miss.flush(timeout=600, upgrades=compile_device and load)
            cold["miss"].append(t1 - t0)
            cold["bg_store"].append(time.perf_counter() - t1)

        def auto_miss() -> None:
            # A new kernel for the cache a user gets: what its codegen's learnt plan makes of it.
            codegen = self.salted(entry)
            if self.auto.tier_plan(entry.name, mode).keyed:  # a key will be computed
                # Untimed, as above; where none will be, its walk of the IR would only evict the
                # caches the timed call then misses (2048-statement C: 17 ms against 9 ms bare).
                self.auto.key_for(mod, target, compile_device=compile_device, codegen=codegen)
            t0 = time.perf_counter()
            _, outcome = self.auto.lower_with_outcome(mod, target, compile_device=compile_device, codegen=codegen)
            t1 = time.perf_counter()
            auto_tiers.append(outcome.tier if outcome.tier != "codegen" else "stored" if outcome.stored else "memory")
            if outcome.stored:  # its write-behind work done before the next timed call, as for miss()
                self.auto.flush(timeout=600, upgrades=compile_device)
            cold["auto_miss"].append(t1 - t0)
            if outcome.tier == "codegen":
                # The cache's part of a keyed miss, on the caller's thread (what the budget is
                # about): the key, then everything but the codegen (lookups, staging the entry or
                # keeping it in memory). An uncached call's Outcome does not split its time.
                cold["auto_key"].append(outcome.key_seconds)
                cold["auto_after"].append(outcome.total_seconds - outcome.codegen_seconds - outcome.key_seconds)

        first = bare()
        estimate = cold["bare"][0]
        if load and getattr(first, "kind", None) == "llvm" and estimate <= jit_max_build:
            # TVM's llvm module JIT-compiles at its first function lookup: a cost the fresh
            # module still owes and a hit (a loaded shared library) does not. Measured once.
            name = sorted(gv.name_hint for gv in mod.functions)[0]
            t0 = time.perf_counter()
            first.get_function(name)
            row["jit_first_call"] = time.perf_counter() - t0
        del first
        cheap = estimate < cold_budget / 8
        if cheap:
            cold["bare"].clear()  # a cheap codegen's first call is a warm-up, not a sample
        miss()
        if load:
            if (entry.name, mode) not in self._learnt:
                # The cache is timed as in a process that has learnt its tiers: a codegen's
                # first LEARN_RUNS calls (every tier, while it learns) are not samples.
                self._learnt.add((entry.name, mode))
                for _ in range(LEARN_RUNS):
                    self.auto.lower(mod, target, compile_device=compile_device, codegen=self.salted(entry))
                    self.auto.flush(timeout=600, upgrades=compile_device)
            auto_miss()
        # An llvm miss's wait for its shared library (seconds: a helper process starts) is not
        # the miss's cost; it may stretch the budget to 4x rather than leave 2 or 3 samples.
        per_pair = estimate * (1 + 2 * cheap) + cold["miss"][0] + min(cold["bg_store"][0], estimate)
        if load:
            per_pair += estimate * (1 + 2 * cheap) + cold["auto_miss"][0]
        # What the calls before the rounds took themselves (the auto cache's learning and the
        # helper processes it waited for are not the rounds' budget).
        left = cold_budget - estimate - cold["miss"][0] - min(cold["bg_store"][0], estimate) \
            - (cold["auto_miss"][0] if load else 0.0)
        # The miss and the cache a user gets are each timed against the bare codegen in rounds of
        # their own: a call right after a stored miss runs slower than after another call of its
        # kind (the miss's work evicts the caches, measured when this was written), which would be charged to
        # whichever variant follows the miss. For a cheap codegen each timed call also follows an
        # untimed run of the bare codegen, so every call follows the same work.
        groups = [("miss", miss)] + ([("auto_miss", auto_miss)] if load else [])
        reps = max(0, min(14, int(left / per_pair)))
        for name, fn in groups:
            started = time.perf_counter()
            for i in range(reps):
                if time.perf_counter() - started > 4 * cold_budget / len(groups):
                    break
                for f in ((bare, fn) if i % 2 else (fn, bare)):
                    if cheap:
                        bare_fn(mod, target)
                    f()
                rounds[name].append(cold[name][-1] - cold["bare"][-1])
        if not cold["bare"]:
            bare()
        row["cold_reps"] = len(rounds["miss"]) or 1
        # Differences taken round by round (the call and the bare codegen of one round), as the
        # hits' ratios are: a slow spell of the machine then moves both.
        row["cold_paired"] = {f"{name}_minus_bare": statistics.median(diffs) for name, diffs in rounds.items() if diffs}
        row["miss_tiers"] = sorted(set(tiers))
        if load:
            row["auto_tiers"] = {t: auto_tiers.count(t) for t in sorted(set(auto_tiers))}
            row["auto_plan"] = self.auto.tier_plan(entry.name, mode).why  # what it decided
        if load:
            assert tiers and set(tiers) == {"codegen"}, f"{kernel}/{codegen}: a cold call was served from {tiers}"

        # ---- what storing costs: encode (for llvm: a shared library) and the two writes ------
        key = keys[0]
        if compile_device and load:
            # llvm entries become shared libraries in a helper process: hits are measured on
            # that form, what a later run finds (the salted misses' upgrades finish here too).
            t0 = time.perf_counter()
            row["upgraded"] = self.miss.flush(timeout=600, upgrades=True)
            row["upgrade_wait"] = time.perf_counter() - t0
        blob = self.disk.store(mode).get(key)
        assert blob is not None, f"{kernel}/{codegen}: the entry was not stored"
        row["artifact_bytes"] = len(blob)
        store = self.miss.store(mode)
        costs: dict[str, list[float]] = {}
        bg = sorted(cold["bg_store"])[len(cold["bg_store"]) // 2]
        if load and bg < cold_budget / 8:  # encode again only where that is cheap; else bg_store says it
            meta = {"key": "store-bench", "codegen": entry.name, "mode": mode, "build_seconds": estimate}
            names = func_names(mod)
            module = bare_fn(mod, target)
            costs = interleave({"encode": lambda: encode(module, meta, func_names=names)},
                               max(1, min(7, int(cold_budget / 4 / max(bg, 1e-4)))), warmup=1)
        costs.update(interleave({
            "put_ours": lambda: store.put(f"store-{next(self._stored)}", blob),
            "put_files": lambda: self.files.put(f"{next(self._stored):032x}", blob),
        }, 5, warmup=1))

        # ---- hits -------------------------------------------------------------------------
        self.files.put(key, blob)
        disk_store = self.disk.store(mode)
        scratch = self.scratch

        # The independent floor (floor.py): TVM's hash + sqlite3/pread of the bytes + TVM's load.
        raw = RawStore(disk_store.directory)
        row["stored_form"], floor_load = floor_loader(blob, scratch)

        def floor():
            tvm_hash(mod)
            floor_load(raw.read(key))

        def floor_ours():  # the former floor: our hash, our read, our decode
            ir_hash(mod)
            decode(disk_store.get(key), scratch=scratch)

        hot = _hot_kwargs()

        def floor_noload():
            tvm_hash(mod)
            raw.read(key)

        def key_only():
            self.disk.key_for(mod, target, compile_device=compile_device)

        def files_hit():
            k = self.disk.key_for(mod, target, compile_device=compile_device).digest
            data = self.files.get(k)
            if load:
                decode(data, scratch=scratch)
            else:
                unframe(data, **hot)

        def disk_noload():
            k = self.disk.key_for(mod, target, compile_device=compile_device).digest
            unframe(self.disk.store(mode).get(k), **hot)

        variants: dict[str, Any] = {"hash": lambda: tvm_hash(mod)}
        if len(mod.functions) > 1:  # the key's hash differs from TVM's module hash here (_key.ir_hash)
            variants["key_hash"] = lambda: ir_hash(mod)
        hash_cost = ir_hash_cost(mod)
        if not load or hash_cost < 1e-3:  # where the hash is large these equal it
            variants["key"] = key_only
            variants["floor_noload"] = floor_noload
        if load:
            # An equal copy costs save_json + load_json (~20x the hash): skipped for large IR in --quick.
            copy = _equal_copy(mod) if hash_cost < copy_max_hash else None
            self.mem.store(mode).put(key, blob)
            self.mem.lower(mod, target, compile_device=compile_device)
            variants["floor"] = floor
            variants["disk"] = lambda: self.disk.lower(mod, target, compile_device=compile_device)
            variants["memory"] = lambda: self.mem.lower(mod, target, compile_device=compile_device)
            if copy is not None:
                variants["memory_eq"] = lambda: self.mem.lower(copy, target, compile_device=compile_device)
            if self.remote is not None:
                self.remote_fill.put(key, blob)
                remote, rstore = self.remote, self.remote.store(mode)
                variants["remote"] = (lambda: remote.lower(mod, target, compile_device=compile_device),
                                      lambda: rstore.delete(key))
            # The cache a user gets, the same kernel again in one process (a re-run cell, a
            # repeated trial): a memory hit where memory pays, else the codegen itself.
            variants["auto"] = lambda: self.auto.lower(mod, target, compile_device=compile_device)
            # A new process on that directory: it reads what the cache learnt (tiers.json) and has
            # nothing in memory (memory_entries=0: each call is a new process's first of this kernel).
            self.auto.flush()
            fresh = CodegenCache(self.root / "auto", memory_entries=0, min_codegen_time="auto")
            variants["auto_fresh"] = lambda: fresh.lower(mod, target, compile_device=compile_device)
            # The codegen in the same rounds, where that is cheap, and where the cache runs it anyway.
            if estimate < 2e-3 or not self.auto.tier_plan(entry.name, mode).keyed:
                variants["bare_w"] = lambda: bare_fn(mod, target)
        else:
            variants["disk"] = disk_noload
        row["hit_tiers"] = self._check_tiers(variants, mod, target, compile_device, key, load)
        # A second group, timed apart: these write, load and unlink a scratch copy on every
        # call, which slowed the variants interleaved with them (llvm vadd disk/floor 1.44x
        # with them in the rounds, 1.25x without, one process, measured).
        others: dict[str, Any] = {"disk_b": variants["disk"], "files": files_hit}
        if load:
            others["floor_ours"] = floor_ours
            for name in ("key", "floor_noload"):  # informational; the goals use the first group
                if name in variants:
                    others[name] = variants.pop(name)

        t0 = time.perf_counter()
        interleave(variants, 1, warmup=0)  # warm-up round, and the cost of one round
        interleave(others, 1, warmup=0)
        per_round = time.perf_counter() - t0
        hit_reps = max(min_hit_reps, min(max_hit_reps, int(hit_budget / max(per_round, 1e-6))))
        hits = interleave(variants, hit_reps, warmup=0)
        hits.update(interleave(others, hit_reps, warmup=0))
        row["hit_reps"] = hit_reps

        raw.close()
        row["t"] = {name: summary(xs) for name, xs in {**cold, **costs, **hits}.items() if xs}
        row["paired"] = _paired(hits, "disk", "floor" if load else "floor_noload", "memory", "hash")
        if hits.get("auto") and hits.get("bare_w"):
            diffs = [a - b for a, b in zip(hits["auto"], hits["bare_w"])]
            row["paired"]["auto_minus_bare"] = statistics.median(diffs)
            row["paired"]["auto_minus_bare_resolution"] = \
                (percentile(diffs, 75) - percentile(diffs, 25)) / math.sqrt(len(diffs))
        if load:
            self.auto.lower(mod, target, compile_device=compile_device)
            row["auto_warm_tier"] = self.auto.lower_with_outcome(mod, target, compile_device=compile_device)[1].tier
            row["auto_fresh_tier"] = fresh.lower_with_outcome(mod, target, compile_device=compile_device)[1].tier
            fresh.close()
            if hits.get("auto_fresh") and hits.get("bare_w"):
                row["paired"]["fresh_minus_bare"] = statistics.median(
                    a - b for a, b in zip(hits["auto_fresh"], hits["bare_w"]))
        return row

    def _check_tiers(self, variants, mod, target, compile_device, key, load) -> dict[str, str]:
        """Which tier each cache variant is served from (a benchmark of the wrong tier is void)."""
        out = {}
        if not load:
            return out
        for name, cache in (("disk", self.disk), ("memory", self.mem), ("remote", self.remote)):
            if name not in variants:
                continue
            if name == "remote":
                cache.store("compiled" if compile_device else "source").delete(key)
            _, outcome = cache.lower_with_outcome(mod, target, compile_device=compile_device)
            out[name] = outcome.tier
            if outcome.tier != name:
                raise RuntimeError(f"the {name} variant was served from {outcome.tier!r}")
        return out


# ---- the alternative a user would pick instead ----------------------------------------------

# The alternative a user would pick instead: a file-per-entry directory cache.
#
# In the style of Triton's and tilelang's kernel caches: one directory per key holding the
# artifact file and a JSON manifest, written into a temporary directory and renamed into place
# (atomic for readers; the first writer wins and later ones discard their copy). It stores the
# same framed artifact bytes as the cache under test, so a comparison measures only the storage.
# What it does not have: a size limit or eviction, single-flight across processes, counters, a
# memory tier, a remote tier, a check that the manifest matches the artifact beyond its size.

ARTIFACT = "artifact.bin"
MANIFEST = "manifest.json"


class FileCache:
    """key -> <root>/<key[:2]>/<key>/{artifact.bin, manifest.json}."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._tmp = self.root / "tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)

    def _entry(self, key: str) -> str:
        # Two-character fan-out, as Triton's and ccache's layouts do, keeps directories small.
        return os.path.join(self.root, key[:2], key)

    def get(self, key: str) -> bytes | None:
        """The bytes stored under `key`, or None (missing or incomplete)."""
        entry = self._entry(key)
        try:
            with open(os.path.join(entry, MANIFEST), "rb") as f:
                manifest = json.loads(f.read())
            with open(os.path.join(entry, manifest["artifact"]), "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError, KeyError, ValueError):
            return None
        if len(data) != manifest.get("size"):
            return None
        return data

    def put(self, key: str, blob: bytes, meta: dict | None = None) -> bool:
        """Store `blob` under `key`; False when another writer got there first."""
        final = self._entry(key)
        if os.path.exists(final):
            return False
        tmp = tempfile.mkdtemp(dir=self._tmp)
        with open(os.path.join(tmp, ARTIFACT), "wb") as f:
            f.write(blob)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump({"key": key, "artifact": ARTIFACT, "size": len(blob), **(meta or {})}, f)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        try:
            os.rename(tmp, final)
        except OSError:  # ENOTEMPTY/EEXIST: a concurrent writer won the rename
            for name in (ARTIFACT, MANIFEST):
                os.unlink(os.path.join(tmp, name))
            os.rmdir(tmp)
            return False
        return True


# ---- scaling: hit latency against the number of entries in a store --------------------------

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
