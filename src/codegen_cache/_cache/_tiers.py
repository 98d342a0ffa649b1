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
from dataclasses import dataclass, field
from typing import Any, Protocol

import xxhash

from .. import _compat
from .._artifacts import decode, needs_upgrade
from .._compat import IRModule, Module
from .._errors import ArtifactError, CudaRuntimeUnavailableError, EntryKeyError
from .._storage._disk import STORAGE_ERRORS, ArtifactStore
from .._storage._memory import MemoryEntry, ModuleLRU
from .._storage._pending import PendingFiles
from ._guard import StorageGuard

__all__ = ["COLLISION", "DiskTier", "Entry", "Hit", "MemoryTier", "Probe", "RemoteTierView", "Tier", "TierChain",
           "ir_digest"]


def ir_digest(mod: IRModule) -> str:
    """Exact content digest of an IRModule (20x the structural hash: verify=True only)."""
    return xxhash.xxh3_128_hexdigest(_compat.save_json(mod).encode())


@dataclass(slots=True)
class Probe:
    """What a lookup asks for: a key digest in one store, for one IRModule."""

    digest: str
    mode: str  # "compiled" or "source": the store
    ir: IRModule | None  # None: trust the digest (codegen_cache.build's index)
    verify: bool = False
    _ir_digest: str | None = None
    library: bool = False  # an llvm build: the remote may hold its shared library (asked for first)

    @property
    def ir_digest(self) -> str:
        """The IRModule's exact digest, computed once per lookup."""
        if self._ir_digest is None:
            self._ir_digest = ir_digest(self.ir)
        return self._ir_digest


@dataclass(slots=True)
class Entry:
    """An entry as the tiers store it: the module, the IRModule it was built from, its bytes."""

    digest: str
    mode: str
    module: Module
    ir: IRModule
    meta: dict[str, Any]
    blob: bytes | None = None
    staged: bool = False  # already written to this host's disk (a remote hit's copy)


@dataclass(slots=True)
class Hit:
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


@dataclass(kw_only=True)
class DiskTier:
    """`<dir>/compiled` and `<dir>/source` (diskcache), with entries still staged in `<dir>/pending`."""

    stores: dict[str, ArtifactStore]
    staged: dict[str, PendingFiles]
    guard: StorageGuard
    scratch: Callable[[], str]
    on_staged_hit: Callable[[str, str, bytes], None]  # (mode, digest, blob): promote it
    on_raw_hit: Callable[[str, str], None]  # (mode, digest): an llvm entry to upgrade
    on_fill: Callable[[str, str, bytes], None] | None = None  # (mode, digest, blob): promote a remote hit's copy
    name: str = "disk"
    _checked: set = field(default_factory=set)

    def get(self, probe: Probe) -> Hit | _Collision | None:
        t0 = time.perf_counter()
        row = self.guard("read", self.stores[probe.mode].read, probe.digest)
        staged = row is None
        blob = self.staged[probe.mode].read(probe.digest) if staged else row.blob
        if blob is None:
            return None
        if staged:
            drop = lambda: self.staged[probe.mode].remove(probe.digest, blob)  # noqa: E731
        else:
            drop = lambda: self.guard("delete", self.stores[probe.mode].delete, probe.digest)  # noqa: E731
        found = decode_entry(self.guard, probe, blob, self.scratch(), "disk", drop)
        if found is None or found is COLLISION:
            return found
        if staged:
            self.on_staged_hit(probe.mode, probe.digest, blob)
        if needs_upgrade(found.module, found.meta):
            self.on_raw_hit(probe.mode, probe.digest)  # served from LLVM IR: not upgraded yet
        found.blob = blob
        return Hit("disk", found, time.perf_counter() - t0)

    def put(self, entry: Entry) -> None:
        if entry.blob is None or entry.staged:
            return
        self.guard("stage", self.staged[entry.mode].write, entry.digest, entry.blob)
        (self.on_fill or self.on_staged_hit)(entry.mode, entry.digest, entry.blob)


@dataclass(kw_only=True)
class RemoteTierView:
    """A shared tier (Redis): `get(digest) -> framed bytes | None`, `put(digest, framed bytes)`.

    A shared library it serves is first written to this host's disk (`stage`: the copy a
    remote hit makes anyway) and mapped from there, rather than from a scratch copy made and
    removed for the load alone; `staged` then moves it into its store, as the chain's fill would.
    """

    remote: Any
    guard: StorageGuard
    scratch: Callable[[], str]
    stage: Callable[[str, str, bytes], str | None] | None = None  # (mode, digest, blob) -> its file, or None
    staged: Callable[[str, str, bytes], None] | None = None  # (mode, digest, blob): decoded fine, promote it
    unstage: Callable[[str, str, bytes], None] | None = None  # (mode, digest, blob): it did not decode
    name: str = "remote"

    def get(self, probe: Probe) -> Hit | _Collision | None:
        t0 = time.perf_counter()
        # Only a RedisTier knows libraries; any other remote is asked for the digest alone.
        blob = self.remote.get(probe.digest, library=True) if probe.library and hasattr(self.remote, "library_key") \
            else self.remote.get(probe.digest)
        if blob is None:
            return None
        # A library is written to this host's disk (the copy a remote hit makes anyway); it is
        # loaded from a private copy of the checked bytes all the same (_artifacts/_private.py).
        path = self.stage(probe.mode, probe.digest, blob) if self.stage is not None and _is_library(blob) else None
        found = decode_entry(self.guard, probe, blob, self.scratch(), "remote", None)
        if found is None or found is COLLISION:
            if path is not None:
                self.unstage(probe.mode, probe.digest, blob)  # not served: not kept on this disk either
            return found
        found.blob = blob
        if path is not None:
            found.staged = True
            self.staged(probe.mode, probe.digest, blob)
        return Hit("remote", found, time.perf_counter() - t0)

    def put(self, entry: Entry) -> None:
        if entry.blob is not None:
            self.remote.put(entry.digest, entry.blob)


def _is_library(blob: bytes) -> bool:
    # The codec name sits just before the field lengths and the footer (_artifacts._frame).
    return b"llvm-so" in blob[-64:]


def decode_entry(guard: StorageGuard, probe: Probe, blob: bytes, scratch: str,
                 tier: str, drop: Callable[[], object] | None) -> Entry | _Collision | None:
    """The entry a stored blob holds for `probe`; None when it is unusable here.

    Its checksum and key are checked before any of it is loaded (decode's `key`): a stored
    shared library's constructors run when it is loaded. What is loaded is `blob` itself, never
    the file it came from. A corrupt entry, or one holding another key, is counted, warned about
    once and dropped (`drop`); one that is fine but not usable here (a CUDA binary without a
    driver, stored without the digest verify needs) is kept for those who can use it.
    """
    try:
        module, meta = decode(blob, scratch=scratch, key=probe.digest)
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

