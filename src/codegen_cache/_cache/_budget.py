"""Which tiers pay for a codegen: a minimum codegen time per tier, learnt from its runs (issue 25).

("build" in this module's names and in tiers.json is one codegen run, not a whole build.)

As JAX's persistent cache does not store what compiled faster than
`jax_persistent_cache_min_compile_time_secs`, an entry is kept only in the tiers whose hit costs
less than building it again, and only where storing it keeps a miss within issue 12's budget,
max(10% of the build, 0.3 ms). A tier "pays" for a codegen and mode when

    build > key + that tier's hit (beyond the key)    and    key + what a miss adds there <= budget

with each term but a hit's load (the least) the median of the last `WINDOW` measurements of
that codegen and mode in this cache object. The
samples: build seconds (misses, uncached runs, and the build time a hit's entry recorded), the
key's share of a build (key seconds / build seconds: the key's structural hash grows with the IR
as the build does, so that ratio predicts the key of the next kernel from its build), a hit's
load seconds per tier, and the caller's miss time beyond build and key. Until `LEARN_BUILDS`
builds were seen every tier is used (as before), so no decision comes from one call, and one
slow call among them moves no median. A stored miss over the budget is still made where one hit
saves `PAYBACK` times what it adds. Where no tier pays, the call runs uncached and computes no key.

What is decided is only where an entry goes; a key and a hit are exactly as before. Measured
hit costs replace the defaults below as soon as a tier served one.

The measurements are kept in `<dir>/tiers.json` (JSON of numbers, written by the background
writer whenever a decision changes, read once by the next cache object on the directory), so
a new process starts from what the last one learnt instead of storing its first builds. A file
that is missing, damaged, a link or too large is ignored: every tier is used until learnt again.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._storage._faults import FILE_MODE, READ_FLAGS, read_whole

logger = logging.getLogger(__name__)

__all__ = ["DISK_HIT_SECONDS", "EVERY_TIER", "LEARN_BUILDS", "MEMORY_HIT_SECONDS", "NO_TIER", "REMOTE_HIT_SECONDS",
           "WINDOW", "Plan", "TierBudget", "miss_budget"]

# A hit's cost beyond its key, until this cache measured one (docs/benchmarks.md: section 1, the
# small kernels' "disk hit" and "remote" minus "key"): the memory tier's dict lookup and counters,
# a disk hit's row read, frame check and module creation, a remote hit's round trip on a LAN.
MEMORY_HIT_SECONDS = 10e-6
DISK_HIT_SECONDS = 60e-6
REMOTE_HIT_SECONDS = 600e-6
LEARN_BUILDS = 3
WINDOW = 9
# A stored miss over the budget is still worth it where one hit of the tier saves this many times
# what the miss added (an llvm build of 0.1 s: a 2 ms hit against a miss 10 ms over the build; a
# 10 ms llvm build whose first misses, making the stores, took 5 ms more), and not where a hit
# saves about what the miss added (2048-statement C: 3.6 ms against 2.5 ms).
PAYBACK = 2.0
# Once learnt, a decision is made again after this many new samples, not after each one: an
# uncached call must cost the codegen and a counter, not a median of every window.
_REDECIDE = 4
# Once a window is full, a hit is measured one time in this many (a hit must stay microseconds).
_HIT_SAMPLING = 8
_FILE_VERSION = 1
_MAX_FILE_BYTES = 256 << 10
_WINDOWS = ("builds", "key_share", "miss_disk", "miss_memory", "load_disk", "load_remote")


def miss_budget(codegen_seconds: float) -> float:
    """What a miss may add to the codegen: max(10% of it, 0.3 ms) (issue 12)."""
    return max(0.1 * codegen_seconds, 0.3e-3)


@dataclass(frozen=True, slots=True)
class Plan:
    """Where one lowering's entry may be read from and stored: `why` says what decided."""

    memory: bool
    disk: bool  # the disk tier, and with it single-flight (the key's build lock)
    remote: bool
    why: str

    @property
    def keyed(self) -> bool:
        """Whether the key is computed at all (False: the codegen runs uncached)."""
        return self.memory or self.disk


EVERY_TIER = Plan(True, True, True, "every tier")
NO_TIER = Plan(False, False, False, "no tier pays")


class _Times:
    """What was measured for one codegen and mode (the last WINDOW of each)."""

    __slots__ = ("builds", "key_share", "miss_disk", "miss_memory", "load_disk", "load_remote", "hits", "plan",
                 "fresh", "saved")

    def __init__(self) -> None:
        self.builds: deque[float] = deque(maxlen=WINDOW)
        self.key_share: deque[float] = deque(maxlen=WINDOW)  # key seconds / build seconds
        self.miss_disk: deque[float] = deque(maxlen=WINDOW)  # a storing miss beyond build and key
        self.miss_memory: deque[float] = deque(maxlen=WINDOW)  # a memory-only miss beyond build and key
        self.load_disk: deque[float] = deque(maxlen=WINDOW)
        self.load_remote: deque[float] = deque(maxlen=WINDOW)
        self.hits = 0
        self.plan: Plan | None = None  # decided from the samples; None: decide again
        self.fresh = 0  # samples since the plan was decided
        self.saved: tuple[bool, bool, bool] | None = None  # the tiers last written to tiers.json

    def added(self) -> None:
        """A sample came in: decide again now while learning, else after every _REDECIDE samples."""
        self.fresh += 1
        if self.plan is not None and (len(self.builds) <= LEARN_BUILDS or self.fresh >= _REDECIDE):
            self.plan = None


def _tiers(plan: Plan) -> tuple[bool, bool, bool]:
    return (plan.memory, plan.disk, plan.remote)


def _usable(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and 0 <= value < 1e5


def _least(samples: deque[float], default: float) -> float:
    # A hit's load is fixed work that noise only makes longer: the least of the window.
    return min(samples) if samples else default


def _median(samples: deque[float], default: float) -> float:
    # Builds and the key's share of them vary by kernel, and what a miss adds (lookup, lock,
    # staging: file system calls) is what the budget is about in the typical call: their median
    # (a first call's one-time costs, toolchain salts or a store's database made, are one sample
    # of three or more; the least of a window mixing kernels was measured too hopeful).
    return statistics.median(samples) if samples else default


class TierBudget:
    """Plans per codegen and mode: `min_codegen_time` "auto" (learnt), or seconds (a fixed threshold).

    With seconds, a codegen whose median build is shorter is kept in memory only (0: every tier,
    always). Lock-free: threads append samples to deques (atomic in CPython); a decision that
    meets a window changing under it is made again at the next call.
    """

    def __init__(self, min_codegen_time: str | float = "auto", *, path: Path | None = None,
                 save_later: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.min_codegen_time = min_codegen_time
        self._times: dict[tuple[str, str], _Times] = {}
        self._path = path  # <dir>/tiers.json: what earlier processes learnt (None: nothing kept)
        self._save_later = save_later  # runs a job off the caller's path (the writer thread)
        self._loaded = path is None

    def plan(self, codegen: str, mode: str) -> Plan:
        """The tiers a lowering of `codegen` in `mode` uses now."""
        if self.min_codegen_time == 0:
            return EVERY_TIER
        times = self._times.get((codegen, mode))
        if times is None:
            if not self._loaded:
                self._load()
                times = self._times.get((codegen, mode))
            if times is None:
                return EVERY_TIER
        plan = times.plan
        if plan is None:
            try:
                plan = times.plan = self._decide(times)
            except RuntimeError:  # "deque mutated during iteration": another thread's sample; decide next call
                return EVERY_TIER
            times.fresh = 0
            if self._save_later is not None and _tiers(plan) != (times.saved or _tiers(EVERY_TIER)):
                times.saved = _tiers(plan)
                self._save_later(self._saver())
        return plan

    # ---- what earlier processes learnt ------------------------------------------------------

    def _load(self) -> None:  # noqa: C901 - one sequence of checks
        """Seed the windows from tiers.json (once per object); a bad file is ignored."""
        self._loaded = True
        try:
            fd = os.open(self._path, READ_FLAGS)  # type: ignore[arg-type]
        except OSError:
            return None
        try:
            data = read_whole(fd, _MAX_FILE_BYTES)
        except OSError:
            data = None
        finally:
            os.close(fd)
        try:
            found = json.loads(data) if data else None
        except (ValueError, UnicodeDecodeError):
            found = None
        if not isinstance(found, dict) or found.get("version") != _FILE_VERSION \
                or not isinstance(found.get("codegens"), dict):
            logger.debug("codegen cache: ignoring %s (not a tiers file of version %d)", self._path, _FILE_VERSION)
            return None
        for name, windows in found["codegens"].items():
            codegen, _, mode = str(name).rpartition("/")
            if not codegen or mode not in ("compiled", "source") or not isinstance(windows, dict) \
                    or (codegen, mode) in self._times:
                continue
            times = _Times()
            for window in _WINDOWS:
                values = windows.get(window, [])
                if isinstance(values, list):
                    getattr(times, window).extend(v for v in values[-WINDOW:] if _usable(v))
            self._times[(codegen, mode)] = times
        return None

    def _saver(self) -> Callable[[], None]:
        """A job writing every window to tiers.json (a copy taken now; written by replacing the file)."""
        try:
            snapshot = {f"{codegen}/{mode}": {w: list(getattr(t, w)) for w in _WINDOWS}
                        for (codegen, mode), t in list(self._times.items())}
        except RuntimeError:  # a window changed under us (another thread): kept at the next decision
            snapshot = None
        path = self._path

        def save() -> None:
            if snapshot is None:
                return
            data = json.dumps({"version": _FILE_VERSION, "codegens": snapshot}).encode()
            temporary = f"{path}.{os.getpid()}.{os.urandom(4).hex()}"
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             FILE_MODE)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
                os.replace(temporary, path)  # a link at `path` is replaced, never followed
            except OSError as err:
                logger.debug("codegen cache: could not keep what was learnt in %s: %s", path, err)
                try:
                    os.unlink(temporary)
                except OSError:
                    pass

        return save

    def built(self, codegen: str, mode: str, codegen_seconds: float, key_seconds: float | None = None) -> None:
        """A codegen ran for `codegen_seconds` (key_seconds: the key of that call, None: not computed)."""
        times = self._for(codegen, mode)
        times.builds.append(codegen_seconds)
        if key_seconds is not None and codegen_seconds > 0:
            times.key_share.append(key_seconds / codegen_seconds)
        times.added()

    def missed(self, codegen: str, mode: str, extra_seconds: float, *, disk: bool) -> None:
        """A miss cost the caller `extra_seconds` beyond its build and key (disk: it was staged)."""
        times = self._for(codegen, mode)
        (times.miss_disk if disk else times.miss_memory).append(max(0.0, extra_seconds))
        times.added()

    def hit(self, codegen: str, mode: str, tier: str, load_seconds: float, key_seconds: float,
            codegen_seconds: float) -> None:
        """A disk or remote hit: its load, its key, and the build its entry recorded."""
        times = self._for(codegen, mode)
        times.hits += 1
        samples = times.load_disk if tier == "disk" else times.load_remote
        if len(samples) == WINDOW and times.hits % _HIT_SAMPLING:
            return
        samples.append(load_seconds)
        if codegen_seconds > 0:
            times.builds.append(codegen_seconds)
            times.key_share.append(key_seconds / codegen_seconds)
        times.added()

    def _for(self, codegen: str, mode: str) -> _Times:
        times = self._times.get((codegen, mode))
        if times is None:
            times = self._times[(codegen, mode)] = _Times()
        return times

    def _decide(self, times: _Times) -> Plan:
        if len(times.builds) < LEARN_BUILDS:
            return EVERY_TIER
        build = statistics.median(times.builds)
        if self.min_codegen_time != "auto":
            if build >= float(self.min_codegen_time):
                return EVERY_TIER
            return Plan(True, False, False, f"the codegen runs in {build * 1e3:.3g} ms, under min_codegen_time")
        key = _median(times.key_share, 0.0) * build
        budget = miss_budget(build)
        memory = build > key + MEMORY_HIT_SECONDS and key + _median(times.miss_memory, MEMORY_HIT_SECONDS) <= budget
        saved = build - key - _least(times.load_disk, DISK_HIT_SECONDS)  # by one disk hit
        stored_miss = key + _median(times.miss_disk, 0.0)  # what a stored miss adds to the build
        disk = memory and saved > 0 and (stored_miss <= budget or saved >= PAYBACK * stored_miss)
        remote = disk and build > key + _least(times.load_remote, REMOTE_HIT_SECONDS)
        if not memory:
            kept = key + _median(times.miss_memory, MEMORY_HIT_SECONDS)  # what a memory-only miss adds
            why = "no tier pays: " + (f"a {build * 1e3:.3g} ms codegen run against a {key * 1e3:.3g} ms key"
                                      if build <= key + MEMORY_HIT_SECONDS else
                                      f"a miss would add {kept * 1e3:.3g} ms (the key {key * 1e3:.3g} ms), over the "
                                      f"budget ({budget * 1e3:.3g} ms)")
            return Plan(False, False, False, why)
        if not disk:
            return Plan(True, False, False, f"memory only: a disk hit or a stored miss costs more than a "
                                            f"{build * 1e3:.3g} ms codegen run allows")
        return Plan(True, True, remote, "every tier" if remote else "memory and disk: a remote hit costs more")
