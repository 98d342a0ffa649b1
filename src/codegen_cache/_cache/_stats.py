"""The cache's counters: what each call did, per tier and per row (codegen and mode).

A *call* is what a user (or TVM, through the switch) asked of the cache: a kernel lowering
(`CodegenCache.lower`: row "<codegen>/<mode>"), a TIR build (`codegen_cache.build`,
`tvm.tirx.build` under the switch: row "build/build"), a Relax compile (`tvm.compile` /
`relax.build` under the switch: row "relax.build/model"). Each call counts exactly one of, in
its row: a hit (of the tier that served it, with the seconds it saved: a lowering's or a build's
codegen seconds, a Relax model's whole compile), a miss (it was
compiled, or a remembered failure was raised), uncacheable (the cache stepped aside: an input
it cannot key, a user's callback without a declared salt), or uncached_cheap (no tier pays for
that codegen's runs: `_budget.py`; no key was computed). The calls a counted call makes (the
TIR build and codegen lowerings of a Relax compile that missed; the lowerings of a build that
missed) are parts of its one count, so they count no hit or miss of their own
(`counted_as_one`); the work they do is counted where it happens: codegen runs, their seconds,
stores, each in the row of the codegen that ran. A call that cannot be keyed at its own level
(a Relax module with an input the model key cannot hold) is not counted there: the calls it
makes are counted as if made directly. So one compile is one hit or one miss, a hit's saved
seconds are counted once, and every total of the hits, misses and seconds is the sum of its
rows. `Outcome` (_outcome.py) of a call names the tier its count was made under.
The counts live in `_storage._counters` (a mapped file per process, folded into `<dir>/stats.sqlite`
at its exit, or by the next process's writer where it had no exit handlers), so they survive the
process and need no flushing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .._storage._counters import CounterTable
from ._writer import writer

if TYPE_CHECKING:
    from ._snapshot import CacheStats

__all__ = ["StatsRecorder", "counted_as_one"]

# True inside a call that is counted as a whole: the calls it makes count no hit or miss.
_inside_counted: contextvars.ContextVar[bool] = contextvars.ContextVar("codegen_cache_inside_counted", default=False)


@contextlib.contextmanager
def counted_as_one() -> Iterator[None]:
    """Inside the block, calls through the cache are parts of the enclosing call's one count."""
    token = _inside_counted.set(True)
    try:
        yield
    finally:
        _inside_counted.reset(token)


class StatsRecorder:
    """Counts lowerings of one cache directory (this process's, and every process's)."""

    def __init__(self, directory: Path | None, *, make_root: bool = True) -> None:
        # make_root=False: counting never makes a missing cache directory (a read-only cache's).
        self.table = CounterTable(directory, background=writer.submit, make_root=make_root) \
            if directory is not None else None
        self._names: dict[tuple[str, str, str], str] = {}
        # (codegen, mode, tier) -> the hit's count names: total, by codegen and mode, saved seconds by them
        self._hit_names: dict[tuple[str, str, str], tuple[str, str, str]] = {}

    def add(self, name: str, amount: float = 1) -> None:
        """Count `amount` more of `name`."""
        if self.table is not None:
            self.table.add(name, amount)

    def check_directory(self) -> None:
        """Count into the cache directory as it is now (it may have been removed and made again)."""
        if self.table is not None:
            self.table.check_linked()

    def add_for(self, codegen: str, mode: str, name: str, amount: float = 1) -> None:
        """Count `name` in the totals and in the (codegen, mode) breakdown."""
        if self.table is not None:
            self.table.add_many(((name, amount), (self._by(codegen, mode, name), amount)))

    def add_call(self, codegen: str, mode: str, name: str, amount: float = 1) -> None:
        """Count a call's outcome other than a hit (misses, uncacheable, uncached_cheap) in its row.

        Not counted inside a call counted as a whole (counted_as_one).
        """
        if self.table is not None and not _inside_counted.get():
            self.table.add_many(((name, amount), (self._by(codegen, mode, name), amount)))

    def add_codegen_run(self, codegen: str, mode: str, seconds: float) -> None:
        """Count a codegen run and its seconds (one lock for the four counts)."""
        if self.table is not None:
            self.table.add_many((("codegen_runs", 1), (self._by(codegen, mode, "codegen_runs"), 1),
                                 ("codegen_seconds", seconds), (self._by(codegen, mode, "codegen_seconds"), seconds)))

    def add_hit(self, codegen: str, mode: str, tier: str, saved: float) -> None:
        """Count a call's hit served by `tier` and the codegen seconds it saved, in its row (one lock).

        Not counted inside a call counted as a whole (counted_as_one).
        """
        if self.table is None or _inside_counted.get():
            return
        names = self._hit_names.get((codegen, mode, tier))
        if names is None:
            name = f"hits_{tier}"
            names = (name, self._by(codegen, mode, name), self._by(codegen, mode, "saved_seconds"))
            self._hit_names[(codegen, mode, tier)] = names
        if saved:
            self.table.add_many(((names[0], 1), (names[1], 1), ("saved_seconds", saved), (names[2], saved)))
        else:
            self.table.add_many(((names[0], 1), (names[1], 1)))

    def _by(self, codegen: str, mode: str, name: str) -> str:
        memo = (codegen, mode, name)
        by = self._names.get(memo)
        if by is None:
            short = "hits" if name.startswith("hits_") else name
            by = self._names[memo] = f"by:{codegen[:24]}:{mode}:{short}"
        return by

    def local(self) -> CacheStats:
        """Counts of this process only."""
        from ._snapshot import CacheStats

        return CacheStats.from_counts(self.table.local() if self.table is not None else {})

    def shared(self) -> CacheStats:
        """Counts of every process that used this directory, since the last reset."""
        from ._snapshot import CacheStats

        if self.table is None:
            return CacheStats()
        return CacheStats.from_counts(self.table.totals(), self.table.zeroed_at())

    def reset(self) -> None:
        """Zero the shared counters (entries stay)."""
        if self.table is not None:
            self.table.reset()
