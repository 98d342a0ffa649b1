"""CodegenCache: memory -> disk -> remote -> build, with single-flight builds and a failure cache."""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
import xxhash
from tvm.ir import IRModule
from tvm.runtime import Module
from tvm.target import Target

from .._artifacts._codecs import decode, encode_cuda_binary, prepare
from .._config import Settings, settings_from_env
from .._errors import ArtifactError, CudaRuntimeUnavailableError
from .._key import CacheKey, compute_key, ir_hash
from ._failures import CACHEABLE_FAILURES, ENVIRONMENT_FAILURES, FailureCache
from .._storage._leases import LeaseManager
from .._storage._memory import MemoryEntry, MemoryTier
from .._outcome import Outcome, _emit_fields, last_outcome
from .._registry import DeviceCodegen, DeviceCodegenRegistry, default_registry
from ._stats import CacheStats, StatsRecorder
from .._storage._fsprobe import scratch_dir, warn_if_unsafe
from .._storage._disk import STORAGE_ERRORS, ArtifactStore, ReadOnlyStoreError, storage_fault
from .._targets import TargetLike, as_target
from ._writer import StoreJob, WriteBehind

__all__ = ["CodegenCache"]

logger = logging.getLogger(__name__)

STORE_NAMES = ("compiled", "source")
_ENCODE_ERRORS = (ArtifactError, ValueError, RuntimeError, OSError, subprocess.SubprocessError)
_POLL_SECONDS = 0.02
_all_caches: weakref.WeakSet[CodegenCache] = weakref.WeakSet()


def _func_names(mod: IRModule) -> list[str]:
    names = []
    for gv, func in mod.functions.items():
        symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
        names.append(str(symbol) if symbol is not None else gv.name_hint)
    return sorted(names)


def _ir_digest(mod: IRModule) -> str:
    """Exact content digest of an IRModule (20x the structural hash: verify=True only)."""
    return xxhash.xxh3_128_hexdigest(tvm.ir.save_json(mod).encode())


class CodegenCache:
    """A content-addressed cache of device codegen results in `directory`."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        compiled_size_limit: int | None = None,
        source_size_limit: int | None = None,
        memory_entries: int | None = None,
        memory_bytes: int | None = None,
        verify: bool | None = None,
        remote: Any = None,
        remote_secret: str | None = None,
        lease_timeout: float | None = None,
        lease_wait: float | None = None,
        failure_ttl: float | None = None,
        recache: bool | None = None,
        write_behind: bool = True,
        registry: DeviceCodegenRegistry | None = None,
        settings: Settings | None = None,
    ) -> None:
        overrides = {
            "directory": Path(directory).expanduser() if directory is not None else None,
            "compiled_size_limit": compiled_size_limit,
            "source_size_limit": source_size_limit,
            "memory_entries": memory_entries,
            "memory_bytes": memory_bytes,
            "verify": verify,
            "remote": remote if isinstance(remote, str) else None,
            "remote_secret": remote_secret,
            "lease_timeout": lease_timeout,
            "lease_wait": lease_wait,
            "failure_ttl": failure_ttl,
            "recache": recache,
        }
        if settings is None:
            settings = settings_from_env(**overrides)
        else:
            settings = _replace(settings, overrides)
        _check_settings(settings)
        self.settings = settings
        self.directory = Path(settings.directory)
        warn_if_unsafe(self.directory)  # SQLite is not safe on NFS/SMB/FUSE: say so once per directory
        self.registry = default_registry if registry is None else registry
        self.write_behind = write_behind
        self._stats = StatsRecorder(self.directory / "stats.sqlite")
        self._stores = {
            name: ArtifactStore(self.directory / name, size_limit=limit,
                                on_evict=lambda n: self._stats.add("evictions", n))
            for name, limit in (("compiled", settings.compiled_size_limit), ("source", settings.source_size_limit))
        }
        self._failures = FailureCache(ArtifactStore(self.directory / "failures", size_limit=64 << 20),
                                      ttl=settings.failure_ttl, guard=self._guard, count=self._stats.add)
        self._leases = LeaseManager(
            ArtifactStore(self.directory / "leases", size_limit=16 << 20), timeout=settings.lease_timeout
        )
        self._memory = MemoryTier(max_entries=settings.memory_entries, max_bytes=settings.memory_bytes,
                                  on_evict=lambda: self._stats.add("evictions_memory"))
        self._warned: set[str] = set()
        self._writer = WriteBehind(self._write)
        self._remote = self._make_remote(remote, settings)
        self._resolved: dict[Target, tuple[int, DeviceCodegen]] = {}  # resolve() per target
        self._scratch_dir: str | None = None
        self._scratch_pid = -1
        # Keys whose verified lookup found a different IRModule (a real hash collision).
        self._verify_collision: dict[str, bool] = {}
        _all_caches.add(self)

    # ---- construction helpers -------------------------------------------------------------

    def _make_remote(self, remote: Any, settings: Settings) -> Any:
        if remote is not None and not isinstance(remote, str):
            return remote  # an object with get(key) -> bytes | None and put(key, blob)
        if not settings.remote:
            return None
        from .._storage._remote import RedisTier

        return RedisTier(settings.remote, secret=settings.remote_secret, on_event=self._stats.add,
                         ttl=settings.remote_ttl, max_entry_bytes=settings.remote_max_entry_bytes)

    def __repr__(self) -> str:
        return f"CodegenCache({str(self.directory)!r})"

    # ---- public API -----------------------------------------------------------------------

    def lower(
        self,
        mod: IRModule,
        target: TargetLike,
        *,
        compile_device: bool = True,
        codegen: DeviceCodegen | str | None = None,
    ) -> Module:
        """Lower `mod` for `target`, from the cache when possible; codegen None resolves it."""
        return self._lower(mod, target, compile_device, codegen)

    def resolve(self, target: TargetLike, codegen: DeviceCodegen | str | None = None) -> DeviceCodegen:
        """The DeviceCodegen to use: given, looked up by name, or resolved from the target."""
        target = as_target(target)
        if isinstance(codegen, DeviceCodegen):
            return codegen
        if codegen is None:
            memo = self._resolved.get(target)
            version = self.registry.version
            if memo is not None and memo[0] == version:
                return memo[1]
            entry = self.registry.resolve(target)
            if len(self._resolved) > 1024:
                self._resolved.clear()
            self._resolved[target] = (version, entry)
            return entry
        if isinstance(codegen, str):
            for entry in self.registry.codegens_for_kind(target.kind.name):
                if entry.name == codegen:
                    return entry
            raise ValueError(
                f"No device codegen named {codegen!r} for target kind {target.kind.name!r}. "
                f"Available: {[c.name for c in self.registry.codegens_for_kind(target.kind.name)]}."
            )
        raise TypeError(f"codegen must be a DeviceCodegen, a name or None, got {type(codegen).__name__}")

    def key_for(
        self,
        mod: IRModule,
        target: TargetLike,
        *,
        compile_device: bool = True,
        codegen: DeviceCodegen | str | None = None,
        structural_hash: int | None = None,
    ) -> CacheKey:
        """The cache key of this lowering (its parts say what went into it)."""
        target = as_target(target)
        return self._key(mod, target, self.resolve(target, codegen), compile_device, structural_hash)

    @staticmethod
    def _key(mod: IRModule, target: Target, entry: DeviceCodegen, compile_device: bool,
             structural_hash: int | None) -> CacheKey:
        toolchain = entry.toolchain(target, compile_device) if entry.toolchain is not None else None
        return compute_key(mod, target, entry.name, compile_device, toolchain=toolchain, salt=entry.salt,
                           structural_hash=structural_hash)

    def lower_with_outcome(
        self,
        mod: IRModule,
        target: TargetLike,
        *,
        compile_device: bool = True,
        codegen: DeviceCodegen | str | None = None,
    ) -> tuple[Module, Outcome]:
        """Like lower(), also returning the Outcome (tier, key, times) of this call."""
        module = self._lower(mod, target, compile_device, codegen)
        outcome = last_outcome()
        assert outcome is not None
        return module, outcome

    def _lower(self, mod: IRModule, target: TargetLike, compile_device: bool,
               codegen: DeviceCodegen | str | None) -> Module:
        start = time.perf_counter()
        if type(target) is not Target:
            target = as_target(target)
        entry = codegen if type(codegen) is DeviceCodegen else self.resolve(target, codegen)
        if not isinstance(mod, IRModule) or not isinstance(entry, DeviceCodegen):
            # Nothing to key (not an IRModule; a duck-typed entry has no key parts): run it uncached.
            self._stats.add("uncacheable")
            run = entry.invoke if isinstance(entry, DeviceCodegen) else entry.lower
            module = run(mod, target, compile_device=compile_device)
            _emit_fields("uncacheable", "", entry.name, "compiled" if compile_device else "source", 0.0, 0.0,
                         time.perf_counter() - start, time.perf_counter() - start, False)
            return module
        if (entry.build if compile_device else entry.build_without_compile) is None:
            entry._func_for(target, compile_device)  # noqa: SLF001 - raises the seed's ValueError
        structural_hash = ir_hash(mod)
        key = self._key(mod, target, entry, compile_device, structural_hash)
        key_seconds = time.perf_counter() - start
        mode = "compiled" if compile_device else "source"

        def done(tier: str, module: Module, load: float, build: float, stored: bool | None = None):
            _emit_fields(tier, key.digest, entry.name, mode, key_seconds, load, build,
                         time.perf_counter() - start, stored)
            return module


        collision = False
        if not self.settings.recache:
            hit = self._memory.get(key.digest)
            if hit is not None:
                if hit.ir.same_as(mod) or tvm_ffi.structural_equal(hit.ir, mod, map_free_vars=True):
                    self._count_hit("hits_memory", hit.meta)
                    return done("memory", hit.module, time.perf_counter() - start - key_seconds,
                                float(hit.meta.get("build_seconds", 0.0)))
                collision = True
                self._count_collision(key)
            if not collision:
                found = self._lookup_tiers(key, mod, mode)
                if found is not None:
                    tier, module, meta, load = found
                    return done(tier, module, load, float(meta.get("build_seconds", 0.0)))
                if found is None and self._verify_collision.get(key.digest):
                    collision = True
                    self._verify_collision.pop(key.digest, None)

        self._stats.add("misses")
        if not self.settings.recache:
            self._failures.raise_if_failed(key, entry.name)
        leased = False
        if not collision and not self.settings.recache:
            leased, found = self._single_flight(key, mod, mode)
            if found is not None:
                # Stored by another process while we waited: counted as a hit by the lookup,
                # so take back the miss (each lower counts as exactly one hit or miss).
                self._stats.add("misses", -1)
                tier, module, meta, load = found
                return done(tier, module, load, float(meta.get("build_seconds", 0.0)))
        try:
            module, build_seconds = self._build(entry, key, mod, target, compile_device)
        except BaseException:
            if leased:
                self._leases.release(key.digest)
            raise
        stored = not collision
        meta = {
            "key": key.digest,
            "parts": key.as_dict(),
            "codegen": entry.name,
            "mode": mode,
            "target_kind": target.kind.name,
            "build_seconds": build_seconds,
            "created": time.time(),
        }
        pending = None
        if stored:
            # Taken on this thread: the module is the caller's from here on (see _artifacts).
            try:
                pending = prepare(module, meta, func_names=_func_names(mod))
            except _ENCODE_ERRORS as err:
                self._stats.add("stores_skipped")
                self._count_error("encode", err)
                stored = False
        if pending is not None:
            size = sum(len(f) for f in pending.fields) or len(pending.llvm_ir or "")
            self._memory.put(key.digest, MemoryEntry(module, mod, size, meta))
            stored = self._enqueue(StoreJob(key, mode, module, mod, pending, leased, structural_hash, entry.name))
        elif leased:
            self._leases.release(key.digest)
        return done("built", module, 0.0, build_seconds, stored)

    def precompile_cuda(self, mod: IRModule, target: TargetLike, *, codegen: DeviceCodegen | str | None = None) -> str:
        """Compile CUDA with nvcc and store the binary for compile_device=True, without a driver.

        This is how a GPU-less host fills the compiled store for GPU hosts. Returns the key.
        """
        from ..codegens.cuda import compile_cuda_payload

        target = as_target(target)
        entry = self.resolve(target, codegen)
        key = self._key(mod, target, entry, True, None)
        stored = None if self.settings.recache else self._guard("read", self._stores["compiled"].get, key.digest)
        if stored is not None or (not self.settings.recache and not self._lease_or_wait_for(key, "compiled")):
            return key.digest
        try:
            t0 = time.perf_counter()
            payload, source = compile_cuda_payload(mod, target)
            seconds = time.perf_counter() - t0
            self._store_cuda_binary(mod, target, entry, key, payload, source, seconds)
        finally:
            self._leases.release(key.digest)
        return key.digest

    def _lease_or_wait_for(self, key: CacheKey, store: str) -> bool:
        """Single-flight without loading the entry: True when this caller should build (it holds
        the lease, or waited past lease_wait); False when another process stored the entry."""
        deadline = time.monotonic() + self.settings.lease_wait
        waited = False
        while True:
            if self._leases.try_acquire(key.digest):
                if self._guard("read", self._stores[store].get, key.digest) is None:
                    return True
                self._leases.release(key.digest)  # stored between our look and the lease
                return False
            if not waited:
                self._stats.add("lease_waits")
                waited = True
            if time.monotonic() >= deadline:
                return True
            time.sleep(_POLL_SECONDS)
            if self._guard("read", self._stores[store].get, key.digest) is not None:
                return False

    def _store_cuda_binary(self, mod, target, entry, key, payload, source, seconds) -> None:
        self._stats.add("builds")
        self._stats.add("build_seconds", seconds)
        meta = {"key": key.digest, "parts": key.as_dict(), "codegen": entry.name, "mode": "compiled",
                "target_kind": target.kind.name, "build_seconds": seconds, "created": time.time()}
        if self.settings.verify:
            meta["ir_digest"] = _ir_digest(mod)
        blob = encode_cuda_binary(payload, source, meta, func_names=_func_names(mod))
        if self._guard("write", self._stores["compiled"].put, key.digest, blob):
            self._stats.add("stores")
            if self._remote is not None:
                self._remote.put(key.digest, blob)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued store of this process is written (or skipped); flush stats."""
        self._writer.wait(timeout)
        self._stats.flush()

    def stats(self, *, shared: bool = True) -> CacheStats:
        """Counters of every process using this directory (shared=False: this process only)."""
        self.flush()
        return self._stats.shared() if shared else self._stats.local()

    def reset_stats(self) -> None:
        """Zero the shared counters."""
        self._stats.reset()

    def clear(self, *, compiled: bool = True, source: bool = True, failures: bool = True) -> int:
        """Remove entries (both stores and the failure cache by default); how many went."""
        self.flush()
        self._memory.clear()
        removed = 0
        for name, wanted in (("compiled", compiled), ("source", source)):
            if wanted:
                removed += self._guard("clear", self._stores[name].clear) or 0
        if failures:
            removed += self._guard("clear", self._failures.store.clear) or 0
        return removed

    def store(self, name: str) -> ArtifactStore:
        """The ArtifactStore 'compiled', 'source' or 'failures' (for tools)."""
        if name == "failures":
            return self._failures.store
        try:
            return self._stores[name]
        except KeyError:
            raise ValueError(f"unknown store {name!r}; expected one of compiled, source, failures") from None

    def close(self) -> None:
        """Flush pending writes and close the stores of this process."""
        self._writer.close()
        self._stats.flush()
        for store in (*self._stores.values(), self._failures.store, self._leases.store):
            store.close()
        if self._remote is not None and hasattr(self._remote, "close"):
            self._remote.close()

    # ---- lookups by digest (codegen_cache.build's index) ----------------------------------

    def lookup_digest(self, digest: str, mode: str | None, *, ir: IRModule | None = None,
                      fresh: bool = False) -> tuple[Module, dict[str, Any]] | None:
        """The module and metadata stored under a key digest, or None; never calls a codegen.

        For codegen_cache.build, whose index knows the digests of a build's entries but not
        their lowered IRModules. Memory first (unless fresh): with `ir`, a hit must hold an
        equal IRModule, as in lower(); without it the digest is trusted. Then, unless mode is
        None (memory only), that mode's store and the remote tier; a module read there is not
        put in memory (a memory entry needs its IRModule). fresh=True returns a newly decoded
        module the caller may change (import_module) without touching what the cache holds.
        Hits are counted; None is not a miss (the caller lowers, and that lowering counts).
        With verify=True, nothing is served by digest alone (`ir` is required).
        """
        if mode is not None and mode not in self._stores:
            raise ValueError(f"unknown mode {mode!r}; expected one of {STORE_NAMES} or None")
        if self.settings.recache or (self.settings.verify and ir is None):
            return None
        if not fresh:
            hit = self._memory.get(digest)
            if hit is not None and (ir is None or hit.ir.same_as(ir)
                                    or tvm_ffi.structural_equal(hit.ir, ir, map_free_vars=True)):
                self._count_hit("hits_memory", hit.meta)
                return hit.module, hit.meta
        if mode is None or self.settings.verify:
            return None
        blob = self._guard("read", self._stores[mode].get, digest)
        tier = "disk"
        if blob is None and self._remote is not None:
            blob, tier = self._remote.get(digest), "remote"
        if blob is None:
            return None
        # _load reads only the digest of its key (and the IRModule only with verify=True).
        loaded = self._load(CacheKey((("digest", digest),), digest), blob, None, mode, tier)
        if loaded is None:
            return None
        if tier == "remote":
            self._guard("write", self._stores[mode].put, digest, blob)
        self._count_hit("hits_remote" if tier == "remote" else "hits_disk", loaded[1])
        return loaded

    def remember(self, digest: str, module: Module, ir: IRModule, meta: dict[str, Any],
                 nbytes: int = 1 << 16) -> None:
        """Keep `module` in the memory tier under `digest`, with the IRModule that makes hits exact.

        For results that are not one codegen's (codegen_cache.build keeps a whole built module
        under its build key): this process only, dropped by clear() and by LRU eviction.
        """
        self._memory.put(digest, MemoryEntry(module, ir, nbytes, meta))

    # ---- tiers ----------------------------------------------------------------------------

    def _lookup_tiers(self, key: CacheKey, mod: IRModule, mode: str, *, remote: bool = True):
        t0 = time.perf_counter()
        blob = self._guard("read", self._stores[mode].get, key.digest)
        tier = "disk"
        if blob is None and remote and self._remote is not None:
            blob = self._remote.get(key.digest)
            tier = "remote"
        if blob is None:
            return None
        loaded = self._load(key, blob, mod, mode, tier)
        if loaded is None:
            return None
        module, meta = loaded
        if tier == "remote":
            self._guard("write", self._stores[mode].put, key.digest, blob)
        self._memory.put(key.digest, MemoryEntry(module, mod, len(blob), meta))
        self._count_hit("hits_remote" if tier == "remote" else "hits_disk", meta)
        return tier, module, meta, time.perf_counter() - t0

    def _load(self, key: CacheKey, blob: bytes, mod: IRModule, mode: str, tier: str):
        try:
            module, meta = decode(blob, scratch=self._scratch())
        except ArtifactError as err:
            self._stats.add("corrupt")
            self._warn_once("corrupt", "codegen cache: dropping a corrupt %s entry %s: %s", tier, key.digest[:16], err)
            if tier == "disk":
                self._guard("delete", self._stores[mode].delete, key.digest)
            return None
        except STORAGE_ERRORS as err:
            self._count_error("load", err)
            return None
        except CudaRuntimeUnavailableError as err:
            # A well-formed compiled CUDA entry (precompile_cuda, or another host's) that this
            # process cannot load: a miss, not a crash of lower(); kept, it is good for GPU hosts.
            logger.debug("codegen cache: %s entry %s not loadable here: %s", tier, key.digest[:16], err)
            return None
        if meta.get("key") != key.digest:
            self._stats.add("corrupt")
            self._warn_once("mismatch", "codegen cache: entry %s holds key %s; ignored", key.digest[:16], str(meta.get("key"))[:16])
            return None
        if self.settings.verify:
            digest = meta.get("ir_digest")
            if digest is None or digest != _ir_digest(mod):
                # Either unverifiable (stored without verify) or a real 64-bit hash collision.
                if digest is not None:
                    self._count_collision(key)
                    self._verify_collision[key.digest] = True
                return None
        return module, meta

    def _single_flight(self, key: CacheKey, mod: IRModule, mode: str):
        """Take the compile lease, or wait for its holder's entry. Returns (leased, found).

        The re-checks read the local disk only: the remote was asked just before, and a lease
        holder sharing this directory writes its entry to the disk first.
        """
        if self._leases.try_acquire(key.digest):
            # Someone may have stored it between our lookup and the lease.
            found = self._lookup_tiers(key, mod, mode, remote=False)
            if found is not None:
                self._leases.release(key.digest)
            return True, found
        self._stats.add("lease_waits")
        deadline = time.monotonic() + self.settings.lease_wait
        while time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
            found = self._lookup_tiers(key, mod, mode, remote=False)
            if found is not None:
                return False, found
            if not self._leases.is_held_elsewhere(key.digest):
                if self._leases.try_acquire(key.digest):
                    found = self._lookup_tiers(key, mod, mode, remote=False)
                    if found is not None:
                        self._leases.release(key.digest)
                    return True, found
        logger.warning("codegen cache: waited %.0fs for another process to build %s; building here",
                       self.settings.lease_wait, key.digest[:16])
        return False, None

    # ---- building and failures ------------------------------------------------------------

    def _build(self, entry: DeviceCodegen, key: CacheKey, mod: IRModule, target: Target, compile_device: bool):
        t0 = time.perf_counter()
        try:
            module = entry.invoke(mod, target, compile_device=compile_device)
        except ENVIRONMENT_FAILURES:
            raise
        except CACHEABLE_FAILURES as err:
            self._failures.remember(key, entry.name, err)
            raise
        seconds = time.perf_counter() - t0
        self._stats.add("builds")
        self._stats.add("build_seconds", seconds)
        return module, seconds

    # ---- writing --------------------------------------------------------------------------

    def _enqueue(self, job: StoreJob) -> bool:
        """Store `job` now (write_behind=False: True when stored) or queue it (True)."""
        if not self.write_behind:
            return self._write(job)
        self._writer.submit(job)
        return True

    def _write(self, job: StoreJob) -> bool:
        """Encode and store one built module; False when it was not stored."""
        try:
            # The mutation guard runs here, off the caller's path: one structural hash.
            after = ir_hash(job.ir)
            if after != job.structural_hash:
                self._memory.discard(job.key.digest)
                self._stats.add("mutations")
                logger.warning(
                    "codegen %r changed its input IRModule (structural hash %016x -> %016x); "
                    "the result was returned but is not cached", job.codegen, job.structural_hash, after,
                )
                return False
            extra = {"ir_digest": _ir_digest(job.ir)} if self.settings.verify else None
            try:
                blob = job.pending.finish(self._scratch(), extra)
            except _ENCODE_ERRORS as err:
                self._stats.add("stores_skipped")
                self._count_error("encode", err)
                return False
            self._memory.put(job.key.digest, MemoryEntry(job.module, job.ir, len(blob), job.pending.meta))
            stored = bool(self._guard("write", self._stores[job.store].put, job.key.digest, blob))
            if stored:
                self._stats.add("stores")
                self._warned.discard("no-space")  # space is back: warn again if it fills up
            else:
                self._stats.add("stores_skipped")
            if self._remote is not None:
                self._remote.put(job.key.digest, blob)
            return stored
        finally:
            if job.release_lease:
                self._leases.release(job.key.digest)

    def _scratch(self) -> str:
        # Made once per process: a hit must not pay a mkdir.
        if self._scratch_dir is None or self._scratch_pid != os.getpid():
            # <dir>/tmp unless it is unwritable or mounted noexec (dlopen of a cached llvm
            # library fails there, so every hit looked corrupt); sweeps killed processes' leftovers.
            self._scratch_dir = scratch_dir(self.directory / "tmp")
            self._scratch_pid = os.getpid()
        return self._scratch_dir

    # ---- accounting -----------------------------------------------------------------------

    def _count_hit(self, name: str, meta: dict[str, Any]) -> None:
        self._stats.add(name, 1, saved_seconds=meta.get("build_seconds", 0.0))

    def _count_collision(self, key: CacheKey) -> None:
        self._stats.add("collisions")
        self._warn_once("collision", "codegen cache: two different IRModules share key %s "
                        "(64-bit structural hash collision); building without caching", key.digest[:16])

    def _count_error(self, kind: str, err: BaseException) -> None:
        self._stats.add(f"error:{kind}")
        # A full disk or a read-only directory fails reads, encodes and writes alike: one
        # warning per fault says what is wrong, not one per operation it broke.
        fault = storage_fault(err, self.directory)
        if isinstance(err, ReadOnlyStoreError):
            logger.debug("codegen cache: %s skipped: %s", kind, err)  # the store warned when it opened
        elif fault == "no-space":
            self._warn_once(fault, "codegen cache: no space left for %s (%s); compiling without storing "
                            "until space is freed", self.directory, err)
        elif fault == "read-only":
            self._warn_once(fault, "codegen cache: %s cannot be written (%s); serving the entries it has "
                            "and storing nothing new", self.directory, err)
        else:
            self._warn_once(kind, "codegen cache: %s failed (%s: %s); continuing without the cache for it",
                            kind, type(err).__name__, err)

    def _warn_once(self, kind: str, msg: str, *args: object) -> None:
        if kind in self._warned:
            logger.debug(msg, *args)
            return
        self._warned.add(kind)
        logger.warning(msg, *args)

    def _guard(self, kind: str, func, *args, **kwargs):
        """Run a storage operation; its failure is counted, logged once, and returns None."""
        try:
            return func(*args, **kwargs)
        except STORAGE_ERRORS as err:
            self._count_error(kind, err)
            return None
        except (TypeError, ArtifactError) as err:  # SafeDisk refusing a row it would have to unpickle
            self._count_error(f"{kind}-unsafe", err)
            return None


def _replace(settings: Settings, overrides: dict[str, Any]) -> Settings:
    import dataclasses

    return dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def _check_settings(settings: Settings) -> None:
    from .._config import ConfigError

    for name in ("compiled_size_limit", "source_size_limit", "memory_entries", "memory_bytes"):
        value = getattr(settings, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(name, value, "a whole number of 0 or more")
    for name in ("lease_timeout", "lease_wait", "failure_ttl"):
        value = getattr(settings, name)
        if not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(name, value, "a number of seconds, 0 or more")


def _flush_all() -> None:
    for cache in list(_all_caches):
        cache.flush(timeout=30)


# Flush when the interpreter starts shutting down, before atexit handlers run: those include
# weakref finalizers that delete TemporaryDirectory objects the writer thread may be using.
try:
    threading._register_atexit(_flush_all)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):
    atexit.register(_flush_all)
