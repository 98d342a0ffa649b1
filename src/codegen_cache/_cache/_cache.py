"""CodegenCache: memory -> disk -> remote -> codegen, single-flight, a failure cache, durable stores.

A lowering computes its key, asks the tier chain, and on a miss takes the key's build lock,
runs the codegen and stages the entry in a file before it returns (`_storage._pending`), so
that the entry survives whatever happens to the process next. A background thread moves
staged entries into their diskcache store and the remote tier; a helper process turns llvm
entries into shared libraries. The directory holds:

    compiled/ source/    diskcache stores of framed entries (compile_device True / False; compiled Relax models in compiled/)
    failures/ index/     remembered codegen failures; whole builds' index (codegen_cache.build)
    staged/<store>/      entries written but not yet in their store (index/ too: stage_index_entry)
    locks/               per-key build locks (flock)
    stats/ stats.sqlite  per-process counters, and the folded totals
    upgrade/ tmp/        llvm entries waiting for a shared library (and the upgrader's lock); scratch files
    outbox/              entries the remote still lacks (`_push`)

With a remote, a miss also takes the key's build lease there (one builder per fleet), the
writer pushes each entry before it removes the staged file, and hits refresh remote TTLs.

What the writer does with a staged entry is `_promotion.Promoter`'s, an object holding the
stores, never the cache. The package's own layers (codegen_cache.build, the Relax model cache,
the tilelang frontend, the command line) use the methods under "for the package's own layers"
below, never the cache's private attributes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _context
from .. import _artifacts
from .._artifacts import FORMAT_VERSION, frame
from .. import _compat
from .._config import (Settings, disabled_by_env, own_env_vars, refuse_file_as_directory, settings_from_env,
                       suggest_env_var, unknown_env_vars)
from .._errors import CACHEABLE_FAILURES, ENVIRONMENT_FAILURES, ReentrantLoweringError, UncacheableError
from .._forksafe import build_gate, renew_after_fork
from .._log import warn_once
from .._key import CacheKey, compute_key, ir_hash
from .._outcome import emit, emit_uncached, run_uncached
from .._registry import DeviceCodegen, DeviceCodegenRegistry, check_prepared, default_registry
from .._storage._disk import KEYS_DIR, ArtifactStore
from .._storage._usage import UseMarks
from .._storage._faults import ensure_dir, warn_read_only, writable
from .._storage._fsprobe import scratch_dir as _usable_scratch_dir
from .._storage._fsprobe import sweep_leftovers
from .._storage._memory import ModuleLRU
from .._storage._pending import PendingFiles
from .._storage._trust import untrusted
from .._targets import TargetLike, as_target
from ._budget import EVERY_TIER, Plan, TierBudget
from ._groups import evict_parts
from ._guard import StorageGuard
from ._mutation import changed, parts_of
from ._stats import StatsRecorder
from ._tiers import COLLISION, DiskTier, Entry, Hit, MemoryTier, Probe, RemoteTierView, TierChain
from ._writer import writer
from .._storage._layout import ENTRY_STORES, FRONTEND_DIR, STAGED_DIR, STORE_NAMES
from .._storage._memory import MemoryEntry
from .._storage._plain import PlainFiles
from .._validate import check_bool, check_timeout

if TYPE_CHECKING:
    from .._compat import IRModule, Module, Target
    from ._failures import FailureCache
    from ._flight import FleetFlight, Lease, SingleFlight
    from ._promotion import Promoter
    from ._push import Pusher
    from ._snapshot import CacheStats

__all__ = ["STORE_NAMES", "CodegenCache", "fresh_results_are_the_callers", "store_in_every_tier"]

logger = logging.getLogger(__name__)

# The directories entries are read from: held to the cache directory's own ownership rule.
_ENTRY_DIRS = (*STORE_NAMES, *(f"{name}/{KEYS_DIR}" for name in STORE_NAMES), STAGED_DIR,
               *(f"{STAGED_DIR}/{name}" for name in (*ENTRY_STORES, "index")), FRONTEND_DIR)

_FORMAT = str(FORMAT_VERSION)
# Set while a caller takes the fresh module of a miss as its own (codegen_cache.build imports its
# device modules into the host module it built): the memory tier must not hand that object out.
_caller_keeps: contextvars.ContextVar[bool] = contextvars.ContextVar("codegen_cache_caller_keeps", default=False)
# Set while a whole build's parts are lowered (codegen_cache.build, tvm.compile): its index and the
# model-level entry need every part stored, whatever one codegen call would be worth on its own.
_every_tier: contextvars.ContextVar[bool] = contextvars.ContextVar("codegen_cache_every_tier", default=False)


@contextlib.contextmanager
def fresh_results_are_the_callers() -> Iterator[None]:
    """Inside the block, a miss's fresh module is not kept in the memory tier (its caller changes it)."""
    token = _caller_keeps.set(True)
    try:
        yield
    finally:
        _caller_keeps.reset(token)


@contextlib.contextmanager
def store_in_every_tier() -> Iterator[None]:
    """Inside the block, lowerings use every tier, however short their codegen runs (_budget.py)."""
    token = _every_tier.set(True)
    try:
        yield
    finally:
        _every_tier.reset(token)


_ENCODE_ERRORS = (ValueError, RuntimeError, OSError)
# Bound of flush(): the background jobs are extras (every entry is staged on disk already).
FLUSH_SECONDS = 30.0
_INDEX_SIZE_LIMIT = 64 << 20


_parts_lock = threading.RLock()  # making one part may make others (the chain: the disk tier: the stores)
renew_after_fork(globals(), "_parts_lock", threading.RLock)


class _made_once:  # noqa: N801 - used as a decorator, as functools.cached_property is
    """A CodegenCache part made at its first use, once: two threads asking at once get the same one.

    After it is made it is an instance attribute (this descriptor defines no __set__), so later
    reads cost what a plain attribute does; functools.cached_property is not used because from
    Python 3.12 on it takes no lock.
    """

    def __init__(self, make: Callable[[Any], Any]) -> None:
        self.make, self.name = make, make.__name__
        self.__doc__ = make.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        with _parts_lock:
            found = obj.__dict__.get(self.name)
            if found is None:
                found = obj.__dict__[self.name] = self.make(obj)
        return found


def _mode_function(codegen: Any, compile_device: bool):
    return codegen.build if compile_device else codegen.build_without_compile


class CodegenCache:
    """A content-addressed cache of device codegen results in `directory`.

    Options (keyword-only; None: the CODEGEN_CACHE_* variable, else the default, see
    docs/configuration.md): compiled_size_limit, source_size_limit, memory_entries,
    memory_bytes, verify, trusted_dirs, remote (a URL, or an object with get(digest) and put(digest, blob)),
    remote_secret, lease_wait, failure_ttl, recache, min_codegen_time (the disk and remote
    tiers' minimum codegen run: "auto" 5 ms, seconds, or 0 for every tier; _budget.py), read_only
    (serve hits, write nothing to the directory; also where it cannot be written);
    write_behind=False moves staged entries into their store before lower() returns; registry:
    the codegens to resolve targets with.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        compiled_size_limit: int | str | None = None,
        source_size_limit: int | str | None = None,
        memory_entries: int | None = None,
        memory_bytes: int | str | None = None,
        verify: bool | None = None,
        trusted_dirs: Any = None,
        remote: Any = None,
        remote_secret: str | None = None,
        lease_wait: float | str | None = None,
        failure_ttl: float | str | None = None,
        recache: bool | None = None,
        min_codegen_time: float | str | None = None,
        read_only: bool | None = None,
        write_behind: bool = True,
        registry: DeviceCodegenRegistry | None = None,
        settings: Settings | None = None,
    ) -> None:
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path (str or os.PathLike) or None, got {type(directory).__name__}")
        if settings is not None and not isinstance(settings, Settings):
            raise TypeError(f"settings must be a codegen_cache.Settings or None, got {type(settings).__name__}")
        if not isinstance(write_behind, bool):
            raise TypeError(f"write_behind must be True or False, got {write_behind!r}")
        if registry is not None and not isinstance(registry, DeviceCodegenRegistry):
            raise TypeError(f"registry must be a DeviceCodegenRegistry or None, got {type(registry).__name__}")
        overrides = {
            "directory": Path(directory).expanduser() if directory is not None else None,
            "compiled_size_limit": compiled_size_limit, "source_size_limit": source_size_limit,
            "memory_entries": memory_entries, "memory_bytes": memory_bytes, "verify": verify,
            "trusted_dirs": trusted_dirs,
            "remote": remote if isinstance(remote, str) else None, "remote_secret": remote_secret,
            "lease_wait": lease_wait, "failure_ttl": failure_ttl, "recache": recache,
            "min_codegen_time": min_codegen_time, "read_only": read_only,
        }
        own = own_env_vars() if settings is None else None  # the environment scanned once
        if own is not None:
            warn_unknown_env(own)
        self.settings = settings_from_env(own, base=settings, **overrides)
        directory = self.settings.directory
        self.directory = directory if isinstance(directory, Path) else Path(directory)
        refuse_file_as_directory(self.directory)
        self.registry = default_registry if registry is None else registry
        self.write_behind = write_behind
        # The stores, tiers, counters and locks are made at their first use (_made_once, below).
        self._remote = self._make_remote(remote, self.settings)
        leases = getattr(self._remote, "leases", None)
        # Fleet-wide single-flight where the remote has build leases (a tier that may write).
        self._fleet: FleetFlight[Hit] | None = None
        if getattr(leases, "enabled", False):
            from ._flight import FleetFlight

            self._fleet = FleetFlight(leases, wait=self.settings.lease_wait, count=self._stats.add)
        self._read_only: bool | None = None  # read_only, once looked at
        self._pusher = None if self.settings.read_only else self._pusher_for(self._remote)
        self._scratch_dir: tuple[int, str] | None = None
        self._swept: int | None = None  # the pid that swept leftovers (_sweep_once)
        self._resolved: dict[Target, tuple[int, Any]] = {}  # resolve() per target and registry version
        self._upgrades_asked: set[str] = set()
        self._trusted: bool | None = None  # may entries be loaded from the directory? (checked once)
        if self._pusher is not None:
            # What processes of this directory left unpushed (killed, exited at once, remote down):
            # what is staged now, not this process's own coming entries (their jobs push them).
            left = {mode: list(files.digests()) for mode, files in self._staged.items()}
            writer.submit(lambda: self._promoter.push_pending(only=left))

    # ---- the parts, each made at its first use -----------------------------------------------
    # A process that never looks into a store does not make them: a tilelang hit reads a plain
    # file, and a fresh process's first hit would pay for parts it never uses.

    @_made_once
    def _stats(self) -> StatsRecorder:
        return StatsRecorder(self.directory, make_root=not self.settings.read_only)

    @_made_once
    def _budget(self) -> TierBudget:
        return TierBudget(self.settings.min_codegen_time, path=self.directory / "tiers.json",
                          save_later=None if self.read_only else writer.submit)

    @_made_once
    def _guard(self) -> StorageGuard:
        return StorageGuard(self.directory, self._stats.add)

    @_made_once
    def _stores(self) -> dict[str, ArtifactStore]:
        limits = {"compiled": self.settings.compiled_size_limit, "source": self.settings.source_size_limit,
                  "failures": 64 << 20, "index": _INDEX_SIZE_LIMIT}
        stores: dict[str, ArtifactStore] = {}
        for name in STORE_NAMES:
            stores[name] = ArtifactStore(self.directory / name, size_limit=limits[name],
                                         on_evict=lambda n: self._stats.add("evictions", n),
                                         along=lambda blob: evict_parts(stores, blob),
                                         read_only=self.settings.read_only)
        return stores

    @_made_once
    def _marks(self) -> UseMarks:
        return UseMarks(self._stores, background=writer.submit)

    @_made_once
    def _staged(self) -> dict[str, PendingFiles]:
        return {name: PendingFiles(self.directory / STAGED_DIR / name) for name in ENTRY_STORES}

    @_made_once
    def _staged_index(self) -> PendingFiles:  # stage_index_entry's
        return PendingFiles(self.directory / STAGED_DIR / "index")

    @_made_once
    def _failures(self) -> FailureCache:
        from ._failures import FailureCache

        return FailureCache(self._stores["failures"], ttl=self.settings.failure_ttl, guard=self._guard,
                            count=self._stats.add)

    @_made_once
    def _flight(self) -> SingleFlight[Hit]:
        from .._storage._locks import KeyLocks
        from ._flight import SingleFlight

        return SingleFlight(KeyLocks(self.directory / "locks"), wait=self.settings.lease_wait, count=self._stats.add)

    @_made_once
    def _memory(self) -> ModuleLRU:
        return ModuleLRU(max_entries=self.settings.memory_entries, max_bytes=self.settings.memory_bytes,
                         on_evict=lambda: self._stats.add("evictions_memory"))

    @_made_once
    def _memory_tier(self) -> MemoryTier:
        return MemoryTier(self._memory)

    @_made_once
    def _disk(self) -> DiskTier:
        return DiskTier(stores=self._stores, staged=self._staged, guard=self._guard, scratch=self.scratch_dir,
                        on_staged_hit=self._promote_later, on_raw_hit=self._ask_upgrade,
                        on_fill=self._promote_fill, on_used=self._marks.mark)

    @_made_once
    def _chain(self) -> TierChain:
        tiers: list = [self._memory_tier, self._disk]
        if self._remote is not None:
            tiers.append(RemoteTierView(remote=self._remote, guard=self._guard, scratch=self.scratch_dir))
        return TierChain(tiers)

    @_made_once
    def _promoter(self) -> Promoter:
        from ._promotion import Promoter

        return Promoter(self.directory, stores=self._stores, staged=self._staged, staged_index=self._staged_index,
                        guard=self._guard, pusher=self._pusher, write_behind=self.write_behind)

    def _make_remote(self, remote: Any, settings: Settings) -> Any:
        if remote is not None and not isinstance(remote, str):
            if not (callable(getattr(remote, "get", None)) and callable(getattr(remote, "put", None))):
                raise TypeError(f"remote must be a URL or an object with get(digest) and put(digest, blob), "
                                f"got {type(remote).__name__}")
            return remote
        if not settings.remote:
            return None
        from .._storage._remotes import open_remote

        tier = open_remote(settings, on_event=self._stats.add)
        if not settings.disable:
            # A fresh process's first remote call would otherwise resolve the name and connect
            # (TLS, AUTH, SELECT) on its caller's path; it waits for this connection instead.
            tier.connect_early()
        return tier

    def _pusher_for(self, remote: Any) -> Pusher | None:
        """What pushes this directory's entries to `remote`; None where it takes no writes (read-only)."""
        if remote is None or getattr(remote, "read_only", False):
            return None
        from ._push import Pusher

        return Pusher(remote, self.directory, max_age=getattr(remote, "ttl", None) or None)

    def __repr__(self) -> str:
        return f"CodegenCache({str(self.directory)!r})"

    @property
    def read_only(self) -> bool:
        """Whether this cache writes nothing to its directory: CODEGEN_CACHE_READ_ONLY (read_only=True), or a
        directory this process cannot write. Hits are served; misses are built and kept in memory only."""
        if self._read_only is None:
            self._read_only = self.settings.read_only or not writable(self.directory)
            if self._read_only and not self.settings.read_only:
                warn_read_only(self.directory)  # not asked for: the user learns why nothing is stored
        return self._read_only

    @property
    def trusted(self) -> bool:
        """Whether entries may be loaded from the directory: nobody but the user (or a team
        sharing a setgid directory) can change it, or `trusted_dirs` names it (docs/reliability.md).

        Checked once per cache object, when first needed (the directory is made then if missing);
        where False, every lowering runs uncached, with one warning naming the directory and its owner.
        """
        if self._trusted is None:
            if not self.directory.is_dir() and not self.settings.read_only:
                try:
                    ensure_dir(self.directory)  # made now by this user; else its parents decide who may make it
                except OSError:
                    pass
            found = untrusted(self.directory, self.settings.trusted_dirs, inside=_ENTRY_DIRS)
            if found is not None:
                warn_once(logger, ("untrusted", str(self.directory)), "codegen cache: not using %s: %s, so "
                          "another user could make you run their code; compiling without the cache. Trust it "
                          "only if everyone who can change it may run code as you: CODEGEN_CACHE_TRUSTED_DIRS "
                          "or CodegenCache(trusted_dirs=...)", self.directory, found)
            self._trusted = found is None
        return self._trusted

    # ---- public API -----------------------------------------------------------------------

    def lower(self, mod: IRModule, target: TargetLike, *, compile_device: bool = True,
              codegen: DeviceCodegen | str | None = None) -> Module:
        """Lower `mod` for `target`, from the cache when possible; codegen None resolves it."""
        return self._lower(mod, target, compile_device, codegen)

    def lower_with_outcome(self, mod: IRModule, target: TargetLike, *, compile_device: bool = True,
                           codegen: DeviceCodegen | str | None = None):
        """Like lower(), also returning the Outcome (tier, key, times) of this call."""
        from .._outcome import last_outcome

        module = self._lower(mod, target, compile_device, codegen)
        outcome = last_outcome()
        assert outcome is not None
        return module, outcome

    def resolve(self, target: TargetLike, codegen: DeviceCodegen | str | None = None) -> Any:
        """The DeviceCodegen to use: given, looked up by name, or resolved from the target."""
        target = as_target(target)
        if codegen is None:
            memo = self._resolved.get(target)
            version = self.registry.version
            if memo is not None and memo[0] == version:
                return memo[1]
            resolved = self.registry.resolve(target)
            if self.registry.version != version:
                # Resolving imported a lazy registration (a new version): resolved again under
                # it, so that the next call finds this answer memoized.
                version = self.registry.version
                resolved = self.registry.resolve(target)
            if len(self._resolved) > 1024:
                self._resolved.clear()
            self._resolved[target] = (version, resolved)
            return resolved
        if isinstance(codegen, str):
            candidates = self.registry.codegens_for_kind(target.kind.name)
            for candidate in candidates:
                if candidate.name == codegen:
                    return candidate
            raise ValueError(f"No device codegen named {codegen!r} for target kind {target.kind.name!r}. "
                             f"Available: {[c.name for c in candidates]}.")
        if isinstance(getattr(codegen, "name", None), str) and hasattr(codegen, "build"):
            return codegen
        raise TypeError(f"codegen must be a DeviceCodegen, a codegen name or None, got {type(codegen).__name__}")

    def key_for(self, mod: IRModule, target: TargetLike, *, compile_device: bool = True,
                codegen: DeviceCodegen | str | None = None, structural_hash: int | None = None) -> CacheKey:
        """The cache key of this lowering (its parts say what went into it)."""
        if not isinstance(mod, _compat.IRModule):
            check_prepared("CodegenCache.key_for", mod)
            raise TypeError(f"key_for expects a tvm.IRModule, got {type(mod).__name__}")
        _check_mode(compile_device)
        target = as_target(target)
        return self._key(mod, target, self.resolve(target, codegen), compile_device, structural_hash)

    @staticmethod
    def _key(mod: IRModule, target: Target, codegen: Any, compile_device: bool,
             structural_hash: int | None) -> CacheKey:
        toolchain = getattr(codegen, "toolchain", None)
        parts = toolchain(target, compile_device) if toolchain is not None else None
        return compute_key(mod, target, codegen.name, compile_device, toolchain=parts,
                           salt=getattr(codegen, "salt", ""),
                           structural_hash=structural_hash, format_version=_FORMAT)

    def precompile_cuda(self, mod: IRModule, target: TargetLike, *, codegen: DeviceCodegen | str | None = None) -> str:
        """Compile CUDA with nvcc and store the binary for compile_device=True, without a driver.

        This is how a GPU-less host fills the compiled store for GPU hosts. Returns the key.
        Raises UncacheableError where the key cannot hold an input (a callback without an
        identity, docs/key.md): nothing could be stored for it.
        """
        from ._precompile import precompile_cuda

        return precompile_cuda(self, mod, target, codegen, flight=self._flight, stage=self._stage)

    def fetch(self, digest: str, mode: str, *, ir: Any = None, fresh: bool = False, count: bool = True,
              codegen: str | None = None, named_exactly: bool = False) -> tuple[Module, dict[str, Any]] | None:
        """The module and metadata stored under a key digest, or None; never calls a codegen.

        For codegen_cache.build, whose index knows the digests of a build's entries but not
        their lowered IRModules. Memory first (unless fresh): with `ir`, a hit must hold an
        equal IRModule, as in lower(); without it the digest is trusted. Then that mode's store
        ("compiled" or "source") and the remote tier. fresh=True returns a newly decoded module
        the caller may change (import_module). With verify=True nothing is served by digest
        alone (`ir` is required), unless named_exactly: the digest was read from an entry that
        verify checked exactly (a model entry whose input digest matched), and the 128-bit
        digest names the entry that build stored. A hit is counted as one call (in the row of
        `codegen`, when given, else "fetch"), unless count=False: codegen_cache.build and the model
        cache read their parts with count=False and count their own call once.
        """
        if mode not in ENTRY_STORES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {ENTRY_STORES}")
        return self._fetch(digest, mode, ir=ir, fresh=fresh, count=count, codegen=codegen,
                           named_exactly=named_exactly)

    def fetch_kept(self, digest: str, *, ir: Any = None, count: bool = True,
                   codegen: str | None = None) -> tuple[Module, dict[str, Any]] | None:
        """What keep() put under `digest`, from this process's memory tier only, or None; as fetch() does."""
        return self._fetch(digest, None, ir=ir, fresh=False, count=count, codegen=codegen)

    def keep(self, digest: str, module: Module, ir: Any, meta: dict[str, Any], nbytes: int = 1 << 16) -> None:
        """Keep `module` in the memory tier under `digest`, with the object that makes hits exact.

        For results that are not one codegen's (codegen_cache.build keeps a whole built module
        under its build key): this process only, dropped by clear() and by LRU eviction.
        """
        self._memory.put(digest, MemoryEntry(module, ir, nbytes, meta))

    def stage_index_entry(self, digest: str, blob: bytes) -> bool:
        """Stage a whole-build entry now (it survives the process) for the writer to store; False: not stored."""
        if self.read_only:
            return False
        return self._promoter.stage_index_entry(digest, blob)

    def promote_index_entry(self, digest: str, blob: bytes) -> None:
        """Move a staged whole-build entry into its store (by the writer; write_behind=False: now)."""
        if not self.read_only:
            self._promoter.promote_index_entry(digest, blob)

    def fetch_remote_entry(self, digest: str) -> bytes | memoryview | None:
        """A whole-build entry (a compiled model, a build's index) from the remote tier, or None.

        What comes back passed the remote's checks (envelope, signature, frame and checksum) and
        nothing of it is decoded here; the caller checks its codec and key. This disk's copy is
        stored by the writer, off the caller's path.
        """
        if self._remote is None or self.settings.disable or self.settings.recache or not self.trusted:
            return None
        found = self._remote.get(digest)
        if found is None:
            return None
        self._promoter.fill_index_entry(digest, found)
        if self._pusher is not None:
            self._refresh_later(digest, None)  # its TTL, and a chain's copy into its earlier tiers
        return found

    def promote_staged(self, *, remote: str | None = None) -> int:
        """Move every staged entry into its store now (tools do, to see all); how many moved.

        They, and the entries marked for the remote, are pushed to this cache's remote, or to
        the `remote` URL given (a tool that opens the cache without its remote tier).
        """
        from .._storage._outbox import Outbox

        pusher = self._pusher
        if remote is not None and pusher is None and (any(next(s.digests(), None) for s in self._staged.values())
                                                      or Outbox(self.directory).pending()):
            pusher = self._pusher_for(self._make_remote(None, dataclasses.replace(self.settings, remote=remote)))
        try:
            return self._promoter.promote_staged(pusher)
        finally:
            if pusher is not None and pusher is not self._pusher:
                pusher.remote.close()

    def flush(self, timeout: float | None = FLUSH_SECONDS, *, upgrades: bool = False) -> bool:
        """Wait (at most `timeout` s) until staged entries of this process are in their stores.

        upgrades=True also waits for llvm entries to become shared libraries (a helper process
        does that). Returns True when everything finished in time. Nothing is lost when it does
        not: staged entries are served, and promoted by whoever reads them.
        """
        timeout = check_timeout("timeout", timeout)
        check_bool("upgrades", upgrades)
        deadline = None if timeout is None else time.monotonic() + timeout
        done = writer.wait(timeout)
        marks = self.__dict__.get("_marks")  # made by the first hit: a cache that served none has none
        if marks is not None:
            marks.write()
        if upgrades:
            remaining = 600.0 if deadline is None else max(0.0, deadline - time.monotonic())
            from ._upgrade import wait_idle

            done = wait_idle(self.directory, remaining) and done
            if self._pusher is not None:
                self._promoter.push_pending()  # the libraries the upgrader made and could not push itself
        return done

    def stats(self, *, shared: bool = True) -> CacheStats:
        """Counters of every process using this directory (shared=False: this process only)."""
        check_bool("shared", shared)
        return self._stats.shared() if shared else self._stats.local()

    def reset_stats(self) -> None:
        """Zero the shared counters (entries stay)."""
        self._stats.reset()

    def clear(self, *, compiled: bool = True, source: bool = True, failures: bool = True,
              index: bool | None = None) -> int:
        """Remove entries (every store by default); how many went. index follows compiled/source."""
        for name, value in (("compiled", compiled), ("source", source), ("failures", failures)):
            check_bool(name, value)
        if index is not None:
            check_bool("index", index)
        self.flush()
        self._memory.clear()
        if index is None:
            index = compiled or source
        removed = 0
        for name, wanted in (("compiled", compiled), ("source", source), ("failures", failures), ("index", index)):
            if wanted:
                removed += self._guard("clear", self._stores[name].clear) or 0
                if name in self._staged:
                    removed += self._staged[name].clear()
                elif name == "index":
                    removed += self._staged_index.clear()
        if index:
            removed += PlainFiles(Path(self.directory) / FRONTEND_DIR).clear()
        return removed

    def store(self, name: str) -> ArtifactStore:
        """The ArtifactStore 'compiled', 'source', 'failures' or 'index' (for tools)."""
        try:
            return self._stores[name]
        except KeyError:
            raise ValueError(f"unknown store {name!r}; expected one of {', '.join(STORE_NAMES)}") from None

    def staged(self, name: str) -> PendingFiles:
        """Entries of store 'compiled', 'source' or 'index' written but not yet moved into it (for tools)."""
        if name == "index":
            return self._staged_index
        try:
            return self._staged[name]
        except KeyError:
            raise ValueError(f"unknown store {name!r}; expected one of {', '.join((*ENTRY_STORES, 'index'))}") \
                from None

    def close(self, timeout: float | None = FLUSH_SECONDS) -> bool:
        """Finish this process's background stores (at most `timeout` s) and close the stores.

        Returns flush()'s answer: False when background jobs were still running (their
        entries are staged on disk: nothing is lost).
        """
        check_timeout("timeout", timeout)
        done = self.flush(timeout)
        for store in self._stores.values():
            store.close()
        if self._remote is not None and hasattr(self._remote, "close"):
            self._remote.close()
        return done

    # ---- for the package's own layers (codegen_cache.build, Relax, tilelang, the command line) --

    @property
    def counters(self) -> StatsRecorder:
        """The directory's counters, for a layer that serves or counts on this cache's behalf."""
        return self._stats

    def scratch_dir(self) -> str:
        """A private directory for this process's scratch files (made once per process)."""
        if self.settings.read_only:
            return tempfile.gettempdir()  # nothing written to the directory, a scratch file included
        if self._scratch_dir is None or self._scratch_dir[0] != os.getpid():
            # <dir>/tmp unless it is unwritable or mounted noexec (dlopen of a cached llvm
            # library fails there). Killed processes' leftovers are swept at the first store.
            self._scratch_dir = (os.getpid(),
                                 _usable_scratch_dir(self.directory / "tmp", root=self.directory, sweep=False))
        return self._scratch_dir[1]

    def entry_used(self, store: str, digest: str) -> None:
        """An entry of `store` was served (a layer read it itself): it counts as used now (eviction is LRU)."""
        self._marks.mark(store, digest)

    def has_entry(self, mode: str, digest: str) -> bool:
        """Whether an entry is stored or staged under `digest` (without decoding it)."""
        return self.entry_blob(mode, digest) is not None

    def entry_blob(self, mode: str, digest: str) -> bytes | None:
        """The framed bytes stored or staged under `digest`, unchecked; None: neither."""
        row = self._guard("read", self._stores[mode].read, digest)
        return row.blob if row is not None else self._staged[mode].read(digest)

    def has_part(self, mode: str, digest: str) -> bool:
        """Whether a content-addressed entry (a model's weights chunk) is in `mode`'s store, without reading it."""
        return bool(self._guard("read", self._stores[mode].contains, digest))

    def drop_part(self, mode: str, digest: str) -> None:
        """Remove a content-addressed entry found damaged (its store's row and any staged file)."""
        self._guard("delete", self._stores[mode].delete, digest)
        self._staged[mode].remove(digest)

    def put_part(self, mode: str, digest: str, blob: bytes, *, staged: bool) -> bool:
        """Store a content-addressed entry the way a miss's entry is: into `mode`'s store and to the remote.

        staged=True writes its file now (it survives the process) and leaves the rest to the
        writer; staged=False does everything now, on the calling thread (the writer's own jobs).
        False: not stored (counted and warned by the guard).
        """
        if staged:
            if not self._guard("stage", self._staged[mode].write, digest, blob):
                return bool(self._guard("write", self._stores[mode].put, digest, blob))
            self._promoter.promote(mode, digest, blob)
            return True
        self._promoter.job(mode, digest, blob, remote=True)()
        return self.has_part(mode, digest)

    def tier_plan(self, codegen: str, mode: str) -> Plan:
        """Which tiers a lowering of `codegen` in `mode` uses now (_budget.py)."""
        return self._budget.plan(codegen, mode)

    # ---- one lowering ---------------------------------------------------------------------

    def _lower(self, mod: IRModule, target: TargetLike, compile_device: bool, codegen: Any) -> Module:
        start = time.perf_counter()
        if compile_device is not True and compile_device is not False:
            _check_mode(compile_device)
        if type(mod) is not _compat.IRModule:
            check_prepared("CodegenCache.lower", mod)
        if type(target) is not _compat.Target:
            target = as_target(target)
        if codegen is None:
            # resolve()'s memo, read here: every lowering of an already resolved target takes it.
            memo = self._resolved.get(target)
            codegen = memo[1] if memo is not None and memo[0] == self.registry.version else self.resolve(target)
        elif type(codegen) is not DeviceCodegen:
            codegen = self.resolve(target, codegen)  # a name: the DeviceCodegen it means
        mode = "compiled" if compile_device else "source"
        if self.settings.disable:
            # CODEGEN_CACHE_DISABLE=1 turns off every cache, explicit ones too: nothing read,
            # stored or counted, the codegen runs (what a harness timing the codegen wants).
            return self._run_uncached(codegen, mod, target, compile_device, mode, start, count=False)
        if self._trusted is not True and not self.trusted:
            # Another user could change what is stored here: nothing is read, stored or counted.
            return self._run_uncached(codegen, mod, target, compile_device, mode, start, count=False)
        plan = self._budget.plan(codegen.name, mode) if isinstance(codegen, DeviceCodegen) and not _every_tier.get() \
            else EVERY_TIER
        if not plan.keyed:
            return self._run_cheap(codegen, mod, target, compile_device, mode, start)
        key = self._key_or_none(codegen, mod, target, compile_device)
        if key is None:
            return self._run_uncached(codegen, mod, target, compile_device, mode, start)
        key_seconds = time.perf_counter() - start
        if not self.settings.recache:
            kept = self._memory.get(key.digest)
            if kept is not None and kept.ir.same_as(mod):
                # The common memory hit (the caller's own IRModule object) without the tier
                # chain's objects; an equal but distinct module goes the chain's way below.
                saved = float(kept.meta.get("build_seconds", 0.0))
                self._stats.add_hit(codegen.name, mode, "memory", saved)
                emit(tier="memory", key=key.digest, codegen=codegen.name, mode=mode, key_seconds=key_seconds,
                     load_seconds=0.0, codegen_seconds=saved, total_seconds=time.perf_counter() - start)
                _artifacts.keep_answering(kept.module)
                self._marks.mark(mode, key.digest)  # its disk entry is in use too (no I/O: a set in memory)
                return kept.module
        probe = Probe(key.digest, mode, mod, self.settings.verify, library=compile_device and target.kind.name == "llvm")
        # The tiers that do not pay for this codegen are not asked either (_budget.py).
        found = None if self.settings.recache else \
            self._chain.lookup(probe, stop=None if plan.remote else 2 if plan.disk else 1)
        if isinstance(found, Hit):
            return self._served(found, codegen.name, mode, key.digest, key_seconds, start)
        return self._miss(codegen, key, probe, target, compile_device, found is COLLISION, key_seconds, start, plan)

    def _key_or_none(self, codegen: Any, mod: Any, target: Target, compile_device: bool) -> CacheKey | None:
        """The key of this lowering, or None where nothing can key it (the codegen runs uncached)."""
        if not isinstance(codegen, DeviceCodegen):
            # A duck-typed codegen (tilelang's registry takes any object with the attributes):
            # its own lower() decides what happens; nothing here knows its key parts.
            return None
        if _mode_function(codegen, compile_device) is None:
            codegen._func_for(target, compile_device)  # noqa: SLF001 - raises the seed's ValueError
        if not isinstance(mod, _compat.IRModule):
            return None  # nothing to key (tilelang's own tests pass placeholders)
        try:
            return self._key(mod, target, codegen, compile_device, ir_hash(mod))
        except UncacheableError as err:
            # An input the key cannot hold: neither stored nor served, every time.
            self._guard.warn(f"uncacheable:{err.what}", "codegen cache: not caching %r results: %s", codegen.name, err)
            return None

    def _run_cheap(self, codegen: DeviceCodegen, mod: Any, target: Target, compile_device: bool, mode: str,
                   start: float) -> Module:
        """No tier pays for this codegen (_budget.py): it runs without a key, timed, to keep learning."""
        function = codegen.build if compile_device else codegen.build_without_compile
        if function is None:
            codegen._func_for(target, compile_device)  # noqa: SLF001 - raises the seed's ValueError
        self._stats.add_call(codegen.name, mode, "uncached_cheap")
        # run_uncached's steps, written out: this path is all a cheap codegen pays on top of its run.
        try:
            module = function(mod, target)
        except BaseException:
            emit_uncached(codegen.name, mode, time.perf_counter() - start, failed=True)
            raise
        seconds = time.perf_counter() - start
        emit_uncached(codegen.name, mode, seconds)
        self._budget.ran(codegen.name, mode, seconds)
        return module

    def _run_uncached(self, codegen: Any, mod: Any, target: Target, compile_device: bool, mode: str,
                      start: float, *, count: bool = True) -> Module:
        if count:
            self._stats.add_call(codegen.name, mode, "uncacheable")
        if isinstance(codegen, DeviceCodegen):
            return run_uncached(codegen.name, mode, lambda: _mode_function(codegen, compile_device)(mod, target), start)
        return run_uncached(codegen.name, mode, lambda: codegen.lower(mod, target, compile_device=compile_device),
                            start)

    def _miss(self, codegen: DeviceCodegen, key: CacheKey, probe: Probe, target: Target, compile_device: bool,
              collision: bool, key_seconds: float, start: float, plan: Plan = EVERY_TIER) -> Module:
        """Serve a remembered failure, or wait for a live build of this key, or build and stage.

        Where only the memory tier pays (`plan`), no build lock is taken and nothing is staged:
        another process building the same cheap kernel meanwhile costs less than the lock.
        """
        mode, mod = probe.mode, probe.ir
        if collision:
            self._count_collision(key.digest)
        # One fstat per miss (not per hit): a directory removed under us gets its counts anew.
        self._stats.check_directory()
        self._stats.add_call(codegen.name, mode, "misses")
        # A codegen only memory pays for fails as cheaply as a remembered failure is raised: its
        # failures are neither read nor written (the exception is the codegen's own either way).
        if not self.settings.recache and plan.disk:
            try:
                self._failures.raise_if_failed(key.digest, codegen.name,
                                               ir_digest=(lambda: probe.ir_digest) if self.settings.verify else None)
            except BaseException:
                emit(tier="failure", key=key.digest, codegen=codegen.name, mode=mode, key_seconds=key_seconds,
                     load_seconds=0.0, codegen_seconds=0.0, total_seconds=time.perf_counter() - start)
                raise
        held = lease = None
        # A read-only cache reads the disk tier and writes nothing there: no build lock, no entry.
        stores = plan.disk and not self.read_only
        if not collision and not self.settings.recache and stores:
            # The recheck reads this directory only: the remote was asked a moment ago, and a
            # lock holder sharing this directory stages its entry here first.
            held, found = self._flight.begin(key.digest, lambda: self._chain.lookup(probe, start=1, stop=2),
                                               codegen=codegen.name)
            if not isinstance(found, Hit) and self._fleet is not None:
                # This machine's builder, one per fleet: a waiter polls the remote for the entry.
                lease, found = self._fleet.begin(key.digest, lambda: self._recheck_remote(probe))
                if isinstance(found, Hit):
                    self._flight.release(held)
            if isinstance(found, Hit):
                # Built by another process while we waited: a hit, not a miss.
                self._stats.add_call(codegen.name, mode, "misses", -1)
                self._memory_tier.put(found.entry)
                return self._served(found, codegen.name, mode, key.digest, key_seconds, start)
        before = parts_of(mod)
        promote = None
        building = time.perf_counter()
        try:
            module, codegen_seconds = self._run_codegen(codegen, key.digest, mod, target, compile_device, probe,
                                                      remember=stores)
            self._budget.ran(codegen.name, mode, codegen_seconds, key_seconds)
            if not collision and stores:
                promote = self._store(codegen.name, key, mode, module, mod, target, codegen_seconds, before, lease)
            elif not collision:
                self._keep(codegen.name, key, mode, module, mod, codegen_seconds, before)
        except BaseException:
            # The codegen raised (its error is remembered when cacheable): the outcome says so,
            # rather than leaving the previous call's in place.
            now = time.perf_counter()
            emit(tier="failure", key=key.digest, codegen=codegen.name, mode=mode, key_seconds=key_seconds,
                 load_seconds=0.0, codegen_seconds=now - building, total_seconds=now - start)
            raise
        finally:
            self._flight.release(held)
            if promote is None and lease is not None:
                self._fleet.release(lease)  # nothing to push: let the next host in now
        emit(tier="codegen", key=key.digest, codegen=codegen.name, mode=mode, key_seconds=key_seconds, load_seconds=0.0,
             codegen_seconds=codegen_seconds, total_seconds=time.perf_counter() - start, stored=promote is not None)
        if promote is not None:
            # Last: once woken, the writer thread takes the GIL whenever this thread waits on a
            # file operation, so anything after this would wait for its SQLite work.
            promote()
        return module

    # ---- a hit, and what it asks of the writer ---------------------------------------------

    def _served(self, hit: Hit, codegen: str, mode: str, digest: str, key_seconds: float, start: float) -> Module:
        saved = float(hit.entry.meta.get("build_seconds", 0.0))
        self._stats.add_hit(codegen, mode, hit.tier, saved)
        if hit.tier != "memory" and self._pusher is not None:
            self._refresh_later(digest, hit.entry.blob)
        emit(tier=hit.tier, key=digest, codegen=codegen, mode=mode, key_seconds=key_seconds,
             load_seconds=hit.load_seconds, codegen_seconds=saved, total_seconds=time.perf_counter() - start)
        if hit.tier == "memory":
            _artifacts.keep_answering(hit.entry.module)  # registered again as the newest (a decoded one is already)
            self._marks.mark(mode, digest)  # its disk entry is in use too (a long-lived process hits from memory)
        return hit.entry.module

    def _fetch(self, digest: str, mode: str | None, *, ir: Any, fresh: bool, count: bool,
               codegen: str | None, named_exactly: bool = False) -> tuple[Module, dict[str, Any]] | None:
        # mode None: fetch_kept, the memory tier only (the chain stops after it).
        unverifiable = self.settings.verify and ir is None and not named_exactly
        if self.settings.disable or self.settings.recache or unverifiable or not self.trusted:
            return None
        hit = None
        if ir is None and not fresh:
            found = self._memory.get(digest)  # the digest is trusted: no IRModule to compare
            if found is not None:
                hit = Hit("memory", Entry(digest, mode or "compiled", found.module, found.ir, found.meta))
        if hit is None and (ir is not None or mode is not None):
            probe = Probe(digest, mode or "compiled", ir, False)
            # A memory entry needs its IRModule (exact hits), and a fresh module is the
            # caller's alone: neither goes into memory.
            hit = self._chain.lookup(probe, start=1 if fresh or ir is None else 0, stop=1 if mode is None else None,
                                     fill=ir is not None and not fresh)
        if not isinstance(hit, Hit):
            return None
        if count:
            # A call of its own: one hit in its row (the codegen's, else "fetch"), so totals stay the rows' sum.
            saved = float(hit.entry.meta.get("build_seconds", 0.0))
            self._stats.add_hit(codegen or "fetch", mode or "kept", hit.tier, saved)
        _artifacts.keep_answering(hit.entry.module)
        return hit.entry.module, hit.entry.meta

    def _refresh_later(self, digest: str, blob: bytes | memoryview | None) -> None:
        """A hit from disk or remote: have the writer extend the remote entry's TTL (once per interval)."""
        due = getattr(self._remote, "refresh_due", None)
        if due is not None and due(digest):
            remote, library = self._remote, blob is not None and b"llvm-so" in bytes(blob[-64:])
            writer.submit(lambda: remote.refresh(digest, library=library))

    def _ask_upgrade(self, mode: str, digest: str) -> None:
        """A hit was served from LLVM IR: have it turned into a shared library (once per process)."""
        if digest not in self._upgrades_asked and not self.read_only:
            self._upgrades_asked.add(digest)
            from ._upgrade import request

            writer.submit(lambda: request(self.directory, mode, digest))

    def _promote_later(self, mode: str, digest: str, blob: bytes) -> None:
        if not self.read_only:
            self._promoter.promote_later(mode, digest, blob)

    def _promote_fill(self, mode: str, digest: str, blob: bytes | memoryview) -> None:
        if not self.read_only:
            self._promoter.promote_fill(mode, digest, blob)

    # ---- a miss: the codegen, then the entry staged or kept -----------------------------

    def _run_codegen(self, codegen: Any, digest: str, mod: IRModule, target: Target, compile_device: bool,
                     probe: Probe, *, remember: bool = True) -> tuple[Module, float]:
        """Call the codegen for a miss, timed; a cacheable failure is remembered where `remember`."""
        mode = probe.mode
        t0 = time.perf_counter()
        try:
            with build_gate:
                module = _mode_function(codegen, compile_device)(mod, target)
        except ENVIRONMENT_FAILURES:
            raise
        except CACHEABLE_FAILURES as err:
            if self._flight.reentered(digest):
                raise ReentrantLoweringError(codegen.name, digest) from err  # the codegen's misuse: not remembered
            if not remember:
                raise
            self._failures.remember(digest, codegen.name, err,
                                    ir_digest=probe.ir_digest if self.settings.verify else None)
            raise
        seconds = time.perf_counter() - t0
        self._stats.add_codegen_run(codegen.name, mode, seconds)
        return module, seconds

    def _store(self, codegen: str, key: CacheKey, mode: str, module: Module, mod: IRModule, target: Target,
               codegen_seconds: float, before: tuple, lease: Lease | None = None) -> Callable[[], None] | None:
        """Stage the entry of a fresh module before lower() returns; its promotion, or None when not stored."""
        change = changed(before, parts_of(mod))
        if change:
            self._stats.add("mutations")
            logger.warning("codegen %r changed its input IRModule (%s); the result was returned but is not cached",
                           codegen, change)
            return None
        meta = {"key": key.digest, "parts": key.as_dict(), "codegen": codegen, "mode": mode,
                "target_kind": target.kind.name, "build_seconds": codegen_seconds, "created": time.time()}
        if self.settings.verify:
            meta["ir_digest"] = Probe(key.digest, mode, mod).ir_digest
        try:
            with build_gate:  # TVM serialises the module
                codec, meta, fields = _artifacts.prepare(module, meta, func_names=_artifacts.symbol_names(before[2]))
            blob = frame(codec, meta, fields)
        except _ENCODE_ERRORS as err:
            self._stats.add("stores_skipped")
            self._guard.error("encode", err)
            return None
        if not _caller_keeps.get():
            self._memory_tier.put(Entry(key.digest, mode, module, mod, meta, blob))
        return self._stage(codegen, mode, key.digest, blob, lease)

    def _keep(self, codegen: str, key: CacheKey, mode: str, module: Module, mod: IRModule, codegen_seconds: float,
              before: tuple) -> None:
        """A miss only the memory tier pays for (_budget.py): the fresh module is kept there, not encoded."""
        change = changed(before, parts_of(mod))
        if change:
            self._stats.add("mutations")
            logger.warning("codegen %r changed its input IRModule (%s); the result was returned but is not cached",
                           codegen, change)
            return
        if _caller_keeps.get():
            return
        self._stats.add_for(codegen, mode, "memory_only")
        meta = {"key": key.digest, "codegen": codegen, "mode": mode, "build_seconds": codegen_seconds}
        self._memory_tier.put(Entry(key.digest, mode, module, mod, meta))

    def _stage(self, codegen: str, mode: str, digest: str, blob: bytes,
               lease: Lease | None = None) -> Callable[[], None] | None:
        """Write an entry's file now (it survives the process); returns what moves it into its store.

        The caller runs that after releasing the key's build lock; None: not staged. The remote
        build lease, if any, is released once the entry is in the remote.
        """
        self._sweep_once()
        # Where staging fails (a symlink planted at staged/ is refused, say), the store itself is
        # written before lower() returns; only where both fail is nothing stored.
        if not self._guard("stage", self._staged[mode].write, digest, blob) \
                and not self._guard("write", self._stores[mode].put, digest, blob):
            self._stats.add("stores_skipped")
            return None
        self._stats.add_for(codegen, mode, "stores")
        self._guard.stored()
        return lambda: self._promoter.promote(mode, digest, blob, lease=lease)

    def _recheck_remote(self, probe: Probe) -> Hit | None:
        """The remote's entry for `probe`, asked afresh (a waiter polls for another host's build)."""
        forget = getattr(self._remote, "forget", None)
        if forget is not None:
            forget(probe.digest)
        found = self._chain.lookup(probe, start=2)
        return found if isinstance(found, Hit) else None

    # ---- what killed processes left --------------------------------------------------------

    def _sweep_once(self) -> None:
        """At this process's first store, the writer sweeps what killed processes left in tmp/ and
        the staged stores (older than an hour): a process that only hits never pays for it."""
        if self._swept == os.getpid():
            return
        self._swept = os.getpid()
        scratch, staged = self.scratch_dir(), (*self._staged.values(), self._staged_index)

        def sweep() -> None:
            sweep_leftovers(scratch)
            for files in staged:
                files.sweep()

        writer.submit(sweep)

    # ---- accounting ---------------------------------------------------------------------------

    def _count_collision(self, digest: str) -> None:
        self._stats.add("collisions")
        self._guard.warn("collision", "codegen cache: two different IRModules share key %s "
                         "(64-bit structural hash collision); building without caching", digest[:16])


def _check_mode(compile_device: object) -> None:
    if type(compile_device) is not bool:
        raise TypeError(f"compile_device must be True or False, got {compile_device!r} "
                        f"({type(compile_device).__name__})")


def warn_unknown_env(environ: Mapping[str, str] | None = None) -> None:
    """Warn once per variable about a CODEGEN_CACHE_* variable that is no setting (a typo: it does nothing)."""
    for var in unknown_env_vars(environ):
        close = suggest_env_var(var)
        warn_once(logger, ("unknown-env", var), "%s is set but is not a codegen-cache setting, so it has no "
                  "effect%s; `codegen-cache config` lists the settings", var,
                  f" (did you mean {close}?)" if close else "")


def _default_cache() -> CodegenCache | None:
    # The constructor reads the environment (once: a fresh process's first hit pays for it).
    return None if disabled_by_env() else CodegenCache()


_context.set_default_factory(_default_cache)
