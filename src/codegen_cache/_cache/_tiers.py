"""The tiers a lookup walks: memory, then disk, then remote, behind one interface.

Each tier answers `get(probe)` with a `Hit`, `COLLISION` (an entry under this key holds
another module: a 64-bit structural-hash collision, proven) or None, and takes `put(entry)`.
The disk and remote tiers decode what they read (as JAX's backend deserializes): a tier hands
out modules, never bytes. `TierChain.lookup` asks them in order and fills the faster tiers
with what a slower one served.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import xxhash

from .. import _compat
from .. import _artifacts
from .._artifacts import Artifact
from .._errors import ArtifactError, CudaRuntimeUnavailableError, EntryKeyError
from .._storage._disk import STORAGE_ERRORS, ArtifactStore
from .._storage._memory import MemoryEntry, ModuleLRU
from .._storage._pending import PendingFiles
from ._guard import StorageGuard

if TYPE_CHECKING:
    from .._compat import IRModule, Module

__all__ = ["COLLISION", "DiskTier", "Entry", "Hit", "MemoryTier", "Probe", "RemoteTierView", "Tier", "TierChain",
           "ir_digest"]


def ir_digest(mod: IRModule) -> str:
    """Exact content digest of an IRModule (a serialization of the whole module: verify=True only)."""
    return xxhash.xxh3_128_hexdigest(_compat.save_json(mod).encode())


# The records of a lookup are plain slotted classes and NamedTuples, not dataclasses: making
# a dataclass costs the cache layer's import (every process's first lowering) far more than
# these few lines (docs/benchmarks.md at 5788f7c, "What the cache layer's import costs").


class Probe:
    """What a lookup asks for: a key digest in one store, for one IRModule."""

    __slots__ = ("digest", "mode", "ir", "verify", "_ir_digest", "library")

    def __init__(self, digest: str, mode: str, ir: IRModule | None, verify: bool = False, *,
                 library: bool = False) -> None:
        self.digest = digest
        self.mode = mode  # "compiled" or "source": the store
        self.ir = ir  # None: trust the digest (codegen_cache.build's index)
        self.verify = verify
        self._ir_digest: str | None = None
        self.library = library  # an llvm build: the remote may hold its shared library (asked for first)

    @property
    def ir_digest(self) -> str:
        """The IRModule's exact digest, computed once per lookup."""
        if self._ir_digest is None:
            self._ir_digest = ir_digest(self.ir)
        return self._ir_digest


class Entry:
    """An entry as the tiers store it: the module, the IRModule it was built from, its bytes."""

    __slots__ = ("digest", "mode", "module", "ir", "meta", "blob")

    def __init__(self, digest: str, mode: str, module: Module, ir: IRModule, meta: dict[str, Any],
                 blob: bytes | memoryview | None = None) -> None:
        self.digest = digest
        self.mode = mode
        self.module = module
        self.ir = ir
        self.meta = meta
        self.blob = blob  # a remote hit's: a read-only view of the checked value

    def __repr__(self) -> str:
        return f"Entry({self.digest!r}, {self.mode!r}, {self.module!r})"


class Hit(NamedTuple):
    """A tier served a module: which tier, the entry, and how long reading and decoding took."""

    tier: str
    entry: Entry
    load_seconds: float = 0.0


class _Collision:
    def __repr__(self) -> str:
        return "COLLISION"


COLLISION: Any = _Collision()


class Tier(Protocol):
    """One tier of the chain."""

    name: str

    def get(self, probe: Probe) -> Hit | _Collision | None:
        """The entry for `probe`, COLLISION, or None."""

    def put(self, entry: Entry) -> None:
        """Keep `entry` (a failure is the tier's to count; never raises for storage)."""


class MemoryTier:
    """The in-process tier: exact hits (the same IRModule object, else structurally equal)."""

    name = "memory"

    def __init__(self, memory: ModuleLRU) -> None:
        self.memory = memory

    def get(self, probe: Probe) -> Hit | _Collision | None:
        found = self.memory.get(probe.digest)
        if found is None:
            return None
        if found.ir.same_as(probe.ir) or _compat.structural_equal(found.ir, probe.ir):
            return Hit("memory", Entry(probe.digest, probe.mode, found.module, probe.ir, found.meta))
        return COLLISION

    def put(self, entry: Entry) -> None:
        size = len(entry.blob) if entry.blob is not None else 1 << 16
        self.memory.put(entry.digest, MemoryEntry(entry.module, entry.ir, size, entry.meta))


class DiskTier:
    """`<dir>/compiled` and `<dir>/source` (diskcache), with entries still staged in `<dir>/staged`."""

    name = "disk"

    def __init__(self, *, stores: dict[str, ArtifactStore], staged: dict[str, PendingFiles], guard: StorageGuard,
                 scratch: Callable[[], str], on_staged_hit: Callable[[str, str, bytes], None],
                 on_raw_hit: Callable[[str, str], None],
                 on_fill: Callable[[str, str, bytes | memoryview], None] | None = None,
                 on_used: Callable[[str, str], None] | None = None) -> None:
        self.stores = stores
        self.staged = staged
        self.guard = guard
        self.scratch = scratch
        self.on_staged_hit = on_staged_hit  # (mode, digest, blob): promote it
        self.on_raw_hit = on_raw_hit  # (mode, digest): an llvm entry to upgrade
        # (mode, digest, blob): keep a remote hit's copy (the cache's writer does); None: stored now
        self.on_fill = on_fill
        self.on_used = on_used  # (mode, digest): a stored entry was served (a mark of use, no I/O)
        self._checked: set = set()

    def get(self, probe: Probe) -> Hit | _Collision | None:
        t0 = time.perf_counter()
        row = self.guard("read", self.stores[probe.mode].read, probe.digest)
        staged = row is None
        blob = self.staged[probe.mode].read(probe.digest) if staged else row.blob
        if blob is None:
            # Another process's writer may have moved the entry between the two reads (its store
            # is written before its staged file goes): the store once more, on a miss only.
            row = self.guard("read", self.stores[probe.mode].read, probe.digest)
            if row is None:
                return None
            staged, blob = False, row.blob
        if staged:
            drop = lambda: self.staged[probe.mode].remove(probe.digest, blob)  # noqa: E731
        else:
            drop = lambda: self.guard("delete", self.stores[probe.mode].delete, probe.digest)  # noqa: E731
        found = decode_entry(self.guard, probe, blob, self.scratch(), "disk", drop)
        if found is None or found is COLLISION:
            return found
        if staged:
            self.on_staged_hit(probe.mode, probe.digest, blob)
        elif self.on_used is not None:
            self.on_used(probe.mode, probe.digest)
        if _artifacts.needs_upgrade(found.module, found.meta):
            self.on_raw_hit(probe.mode, probe.digest)  # served from LLVM IR: not upgraded yet
        found.blob = blob
        return Hit("disk", found, time.perf_counter() - t0)

    def put(self, entry: Entry) -> None:
        # A slower tier's hit (the remote's): `on_fill` stores this host's copy, by the writer;
        # nothing is staged first, since a copy lost in a crash costs one more remote hit.
        if entry.blob is None:
            return
        if self.on_fill is not None:
            self.on_fill(entry.mode, entry.digest, entry.blob)
        else:
            self.guard("write", self.stores[entry.mode].put, entry.digest, bytes(entry.blob))


class RemoteTierView:
    """A shared tier (Redis): `get(digest) -> framed bytes | None`, `put(digest, framed bytes)`.

    A RedisTier is asked with `fetch`: what it checked (envelope, signature, frame) comes back
    as a view of the bytes it read, unframed once, and is decoded from there. Nothing is written
    on the caller's path: the chain's fill hands this host's copy to the disk tier, whose writer
    stores it (a process that dies first costs a later remote hit, nothing else).
    """

    name = "remote"

    def __init__(self, *, remote: Any, guard: StorageGuard, scratch: Callable[[], str]) -> None:
        self.remote = remote
        self.guard = guard
        self.scratch = scratch

    def get(self, probe: Probe) -> Hit | _Collision | None:
        t0 = time.perf_counter()
        fetch = getattr(self.remote, "fetch", None)  # a RedisTier; any other remote has get(digest) alone
        if fetch is not None:
            found = fetch(probe.digest, library=probe.library)
            if found is None:
                return None
            blob, unframed = found.frame, found.artifact
        else:
            blob, unframed = self.remote.get(probe.digest), None
            if blob is None:
                return None
        found = decode_entry(self.guard, probe, blob, self.scratch(), "remote", None, unframed)
        if found is None or found is COLLISION:
            return found
        found.blob = blob
        return Hit("remote", found, time.perf_counter() - t0)

    def put(self, entry: Entry) -> None:
        if entry.blob is not None:
            self.remote.put(entry.digest, bytes(entry.blob))


def decode_entry(guard: StorageGuard, probe: Probe, blob: bytes | memoryview, scratch: str,
                 tier: str, drop: Callable[[], object] | None, unframed: Artifact | None = None
                 ) -> Entry | _Collision | None:
    """The entry a stored blob holds for `probe`; None when it is unusable here.

    Its checksum and key are checked before any of it is loaded (decode's `key`): a stored
    shared library's constructors run when it is loaded. What is loaded is `blob` itself, never
    the file it came from. A corrupt entry, or one holding another key, is counted, warned about
    once and dropped (`drop`); one that is fine but not usable here (a CUDA binary without a
    driver, stored without the digest verify needs) is kept for those who can use it.
    `unframed`: `blob` already unframed and checksummed (the remote tier's check did it).
    """
    try:
        module, meta = _artifacts.decode(blob, scratch=scratch, key=probe.digest, unframed=unframed)
    except EntryKeyError as err:
        guard.count("corrupt")
        guard.warn("mismatch", "codegen cache: entry %s holds key %s; ignored", probe.digest[:16],
                   str(err.found)[:16])
        if drop is not None:
            drop()
        return None
    except ArtifactError as err:
        guard.count("corrupt")
        guard.warn("corrupt", "codegen cache: dropping a corrupt %s entry %s: %s", tier, probe.digest[:16], err)
        if drop is not None:
            drop()
        return None
    except STORAGE_ERRORS as err:
        guard.error("load", err)
        return None
    except CudaRuntimeUnavailableError as err:
        # A well-formed compiled CUDA entry (precompile_cuda, or another host's) that this
        # process cannot load: a miss, not a crash of lower(); kept, it is good for GPU hosts.
        guard.debug("codegen cache: %s entry %s not loadable here: %s", tier, probe.digest[:16], err)
        return None
    if probe.verify:
        stored = meta.get("ir_digest")
        if stored is None:
            return None  # stored without verify: unverifiable, so not served (kept)
        if stored != probe.ir_digest:
            return COLLISION  # a real 64-bit hash collision
    return Entry(probe.digest, probe.mode, module, probe.ir, meta)


class TierChain:
    """Tiers in order; a hit in a slower tier is put into the faster ones."""

    def __init__(self, tiers: Sequence[Tier]) -> None:
        self.tiers = list(tiers)

    def lookup(self, probe: Probe, *, start: int = 0, stop: int | None = None,
               fill: bool = True) -> Hit | _Collision | None:
        """Ask tiers[start:stop] in order; the first answer that is not None wins.

        With fill, a hit is also put into every tier faster than the one that served it.
        """
        for index, tier in enumerate(self.tiers[start:stop], start):
            found = tier.get(probe)
            if found is None:
                continue
            if fill and found is not COLLISION:
                for faster in self.tiers[:index]:
                    faster.put(found.entry)
            return found
        return None

