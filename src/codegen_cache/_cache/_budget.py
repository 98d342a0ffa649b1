"""Which tiers keep a codegen's entries: a fixed minimum codegen time per tier, as JAX has.

As JAX's persistent cache does not store what compiled faster than
`jax_persistent_cache_min_compile_time_secs`, an entry goes to the disk and the remote tier only
when its codegen runs for at least MIN_CODEGEN_SECONDS (`min_codegen_time` seconds replace it;
0: every tier, always). The reason for the default is in docs/cache.md: a stored miss stages a
file and a disk or remote hit reads one, costs a codegen of that length repays many times.

The memory tier has no minimum of its own, but a call that only the memory tier pays for must
never be slower than no cache: a new kernel's call (its key, then the codegen and the entry kept
in memory) may add at most `no_slower_budget`, max(10% of the codegen run, NO_SLOWER_SECONDS).
Where the key and the memory tier's work do not fit that, no tier pays: the call runs uncached
and computes no key. This keeps a cheap codegen (a source-only CUDA kernel, a structural hash of
a tenth of its run or more) and a source-only codegen of a large module (a hash of 40-75% of its
run) from being made slower by the cache. A stored miss is held to the larger `miss_budget`.

"The codegen run" and "the key" of a codegen and mode are the medians of its last `WINDOW` runs
and of the key's share of them (the key's structural hash grows with the IR as the codegen
does), in this cache object. Until `LEARN_RUNS` runs were seen every tier is used, so no
decision comes from one call, and one slow call among them moves no median. What is decided is
only where an entry goes; a key and a hit are exactly as with every tier.

The two windows are kept in `<dir>/tiers.json` (JSON of numbers, written by the background
writer whenever a decision changes, read once by the next cache object on the directory), so
a new process runs a cheap codegen uncached from its first call. A file that is missing,
damaged, a link or too large is ignored: every tier is used until learnt again.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from .._storage._faults import FILE_MODE, READ_FLAGS, read_whole

logger = logging.getLogger(__name__)

__all__ = ["EVERY_TIER", "LEARN_RUNS", "MEMORY_HIT_SECONDS", "MEMORY_MISS_SECONDS", "MIN_CODEGEN_SECONDS", "NO_SLOWER_SECONDS", "NO_TIER",
           "WINDOW", "Plan", "TierBudget", "miss_budget", "no_slower_budget"]

# The disk and remote tiers' minimum codegen run (docs/cache.md, "Which tiers pay").
MIN_CODEGEN_SECONDS = 5e-3
# What a memory hit and a memory-only miss add beyond the key: a dict lookup and the counters.
MEMORY_HIT_SECONDS = 10e-6
# What a memory-only miss adds beyond the key: the memory tier's lookup, keeping the module, the counters.
MEMORY_MISS_SECONDS = 30e-6
# What a call only the memory tier pays for may add to a cheap codegen (no_slower_budget).
NO_SLOWER_SECONDS = 20e-6
LEARN_RUNS = 3
WINDOW = 9
# Once learnt, a decision is made again after this many new runs, not after each one: an
# uncached call must cost the codegen and a counter, not two medians.
_REDECIDE = 4
_FILE_VERSION = 2
_MAX_FILE_BYTES = 256 << 10
_WINDOWS = ("codegen_seconds", "key_share")


def miss_budget(codegen_seconds: float) -> float:
    """What a stored miss may add to the codegen: max(10% of it, 0.3 ms)."""
    return max(0.1 * codegen_seconds, 0.3e-3)


def no_slower_budget(codegen_seconds: float) -> float:
    """What any other call through the cache may add to the codegen: max(10% of it, NO_SLOWER_SECONDS)."""
    return max(0.1 * codegen_seconds, NO_SLOWER_SECONDS)


class Plan(NamedTuple):
    """Where one lowering's entry may be read from and stored: `why` says what decided (made by `_plan`).

    A NamedTuple, not a frozen dataclass: the class is made when the cache layer is imported,
    and a dataclass is several times as dear to make (docs/benchmarks.md at 5788f7c, "Records made at import").
    """

    memory: bool
    disk: bool  # the disk tier, and with it single-flight (the key's build lock)
    remote: bool
    why: str
    keyed: bool  # memory or disk: whether the key is computed at all (False: the codegen runs uncached)


def _plan(memory: bool, disk: bool, remote: bool, why: str) -> Plan:
    # keyed is a field, not a property: every lowering reads it.
    return Plan(memory, disk, remote, why, memory or disk)


EVERY_TIER = _plan(True, True, True, "every tier")
NO_TIER = _plan(False, False, False, "no tier pays")


class _Runs:
    """The last WINDOW codegen runs of one codegen and mode, and the key's share of them."""

    __slots__ = ("codegen_seconds", "key_share", "plan", "fresh", "saved")

    def __init__(self) -> None:
        self.codegen_seconds: deque[float] = deque(maxlen=WINDOW)
        self.key_share: deque[float] = deque(maxlen=WINDOW)  # key seconds / codegen seconds
        self.plan: Plan | None = None  # decided from the windows; None: decide again
        self.fresh = 0  # runs since the plan was decided
        self.saved: tuple[bool, bool, bool] = (True, True, True)  # the tiers last written to tiers.json


def _usable(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and 0 <= value < 1e5


class TierBudget:
    """Plans per codegen and mode from `min_codegen_time`: "auto" (MIN_CODEGEN_SECONDS) or seconds.

    Lock-free: threads append to deques (atomic in CPython); a decision that meets a window
    changing under it is made again at the next call.
    """

    def __init__(self, min_codegen_time: str | float = "auto", *, path: Path | None = None,
                 save_later: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.min_codegen_time = min_codegen_time
        self._shared_minimum = MIN_CODEGEN_SECONDS if min_codegen_time == "auto" else float(min_codegen_time)
        self._runs: dict[tuple[str, str], _Runs] = {}
        self._path = path  # <dir>/tiers.json: what earlier processes learnt (None: nothing kept)
        self._save_later = save_later  # runs a job off the caller's path (the writer thread)
        self._loaded = path is None

    def plan(self, codegen: str, mode: str) -> Plan:
        """The tiers a lowering of `codegen` in `mode` uses now."""
        if self.min_codegen_time == 0:
            return EVERY_TIER
        runs = self._runs.get((codegen, mode))
        if runs is None:
            if not self._loaded:
                self._load()
                runs = self._runs.get((codegen, mode))
            if runs is None:
                return EVERY_TIER
        plan = runs.plan
        if plan is None:
            try:
                plan = runs.plan = self._decide(runs)
            except RuntimeError:  # "deque mutated during iteration": another thread's run; decide next call
                return EVERY_TIER
            runs.fresh = 0
            tiers = (plan.memory, plan.disk, plan.remote)
            if self._save_later is not None and tiers != runs.saved:
                runs.saved = tiers
                self._save_later(self._saver())
        return plan

    def ran(self, codegen: str, mode: str, codegen_seconds: float, key_seconds: float | None = None) -> None:
        """A codegen ran for `codegen_seconds` (key_seconds: the key of that call, None: not computed)."""
        runs = self._runs.get((codegen, mode))
        if runs is None:
            runs = self._runs[(codegen, mode)] = _Runs()
        runs.codegen_seconds.append(codegen_seconds)
        if key_seconds is not None and codegen_seconds > 0:
            runs.key_share.append(key_seconds / codegen_seconds)
        runs.fresh += 1
        if runs.plan is not None and (len(runs.codegen_seconds) <= LEARN_RUNS or runs.fresh >= _REDECIDE):
            runs.plan = None

    def _decide(self, runs: _Runs) -> Plan:
        if len(runs.codegen_seconds) < LEARN_RUNS:
            return EVERY_TIER
        run = _median(runs.codegen_seconds)
        key = (_median(runs.key_share) if runs.key_share else 0.0) * run
        budget = no_slower_budget(run)
        if key + MEMORY_HIT_SECONDS >= run or key + MEMORY_MISS_SECONDS > budget:
            return _plan(False, False, False, f"no tier pays: a {key * 1e3:.3g} ms key against a {run * 1e3:.3g} ms "
                                              f"codegen run (budget {budget * 1e3:.3g} ms)")
        if run < self._shared_minimum:
            return _plan(True, False, False, f"memory only: the codegen runs in {run * 1e3:.3g} ms, under "
                                             f"min_codegen_time ({self._shared_minimum * 1e3:.3g} ms)")
        return EVERY_TIER

    # ---- what earlier processes learnt ------------------------------------------------------

    def _load(self) -> None:
        """Seed the windows from tiers.json (once per object); a bad file is ignored."""
        self._loaded = True
        try:
            fd = os.open(self._path, READ_FLAGS)  # type: ignore[arg-type]
        except OSError:
            return
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
            return
        for name, windows in found["codegens"].items():
            codegen, _, mode = str(name).rpartition("/")
            if not codegen or mode not in ("compiled", "source") or not isinstance(windows, dict) \
                    or (codegen, mode) in self._runs:
                continue
            runs = _Runs()
            for window in _WINDOWS:
                values = windows.get(window, [])
                if isinstance(values, list):
                    getattr(runs, window).extend(v for v in values[-WINDOW:] if _usable(v))
            self._runs[(codegen, mode)] = runs

    def _saver(self) -> Callable[[], None]:
        """A job writing every window to tiers.json (a copy taken now; written by replacing the file)."""
        try:
            snapshot = {f"{codegen}/{mode}": {w: list(getattr(r, w)) for w in _WINDOWS}
                        for (codegen, mode), r in list(self._runs.items())}
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


def _median(values: Iterable[float]) -> float:
    # Not statistics.median: every process that enables the cache would import statistics and
    # fractions for it (docs/benchmarks.md at 5788f7c, "What enable() imports").
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
