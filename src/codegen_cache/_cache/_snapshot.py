"""CacheStats, a snapshot of a cache directory's counters (what `CodegenCache.stats()` returns), and their names.

Apart from the counting (_stats.py), and imported at the first snapshot: the class has more
than thirty fields, and making a dataclass that size is a measurable part of the cache layer's
import, which every process pays at its first lowering (docs/benchmarks.md at 5788f7c, "What the cache
layer's import costs").
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BREAKDOWN", "COUNTERS", "CacheStats"]

COUNTERS = (
    "hits_memory",
    "hits_disk",
    "hits_remote",
    "misses",
    "codegen_runs",
    "stores",
    "stores_skipped",
    "uncacheable",
    "uncached_cheap",
    "memory_only",
    "evictions",
    "evictions_memory",
    "collisions",
    "corrupt",
    "failures_stored",
    "failures_served",
    "mutations",
    "lease_waits",
    "upgrades",
    "remote_stores",
    "remote_rejected",
    "remote_misses",
    "remote_skipped",
    "remote_offline",
    "remote_kept",
    "remote_replaced",
    "remote_refreshed",
    "remote_lease_waits",
    "codegen_seconds",
    "saved_seconds",
)
# Counted per codegen and mode too ("by:<codegen>:<mode>:<name>").
BREAKDOWN = ("hits", "misses", "codegen_runs", "stores", "uncacheable", "uncached_cheap", "memory_only",
             "codegen_seconds", "saved_seconds")


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the counters; `errors` maps an error kind to its count.

    `by_codegen` maps "codegen/mode" (e.g. "cuda/source") to that pair's hits, misses,
    codegen_runs, stores, uncacheable, uncached_cheap, memory_only, codegen_seconds and
    saved_seconds. `zeroed_at`: when the counters were last reset (seconds since the epoch;
    None: never).
    """

    hits_memory: int = 0
    hits_disk: int = 0
    hits_remote: int = 0
    misses: int = 0
    codegen_runs: int = 0
    stores: int = 0
    stores_skipped: int = 0
    uncacheable: int = 0
    uncached_cheap: int = 0
    memory_only: int = 0
    evictions: int = 0
    evictions_memory: int = 0
    collisions: int = 0
    corrupt: int = 0
    failures_stored: int = 0
    failures_served: int = 0
    mutations: int = 0
    lease_waits: int = 0
    upgrades: int = 0
    remote_stores: int = 0
    remote_rejected: int = 0
    remote_misses: int = 0
    remote_skipped: int = 0
    remote_offline: int = 0
    remote_kept: int = 0
    remote_replaced: int = 0
    remote_refreshed: int = 0
    remote_lease_waits: int = 0
    codegen_seconds: float = 0.0
    saved_seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    by_codegen: dict[str, dict[str, float]] = field(default_factory=dict)
    zeroed_at: float | None = None

    @property
    def hits(self) -> int:
        """Hits of every tier."""
        return self.hits_memory + self.hits_disk + self.hits_remote

    def as_dict(self) -> dict[str, object]:
        """Every counter, plus hits, as a JSON-ready dict."""
        out: dict[str, object] = {name: getattr(self, name) for name in COUNTERS}
        out["hits"] = self.hits
        out["errors"] = dict(self.errors)
        out["by_codegen"] = {k: dict(v) for k, v in self.by_codegen.items()}
        out["zeroed_at"] = self.zeroed_at
        return out

    @classmethod
    def from_counts(cls, counts: dict[str, float], zeroed_at: float | None = None) -> CacheStats:
        """Build from flat names ('error:<kind>' go to errors, 'by:<codegen>:<mode>:<name>' to by_codegen)."""
        values: dict[str, object] = {}
        errors: dict[str, int] = {}
        by: dict[str, dict[str, float]] = {}
        for name, value in counts.items():
            if name.startswith("error:"):
                if int(value):
                    errors[name[6:]] = int(value)
            elif name.startswith("by:"):
                pair, _, counter = name[3:].rpartition(":")
                codegen, _, mode = pair.rpartition(":")
                if counter in BREAKDOWN and codegen:
                    row = by.setdefault(f"{codegen}/{mode}", {c: 0 for c in BREAKDOWN})
                    row[counter] += float(value) if counter.endswith("seconds") else int(value)
            elif name in COUNTERS:
                values[name] = values.get(name, 0) + (float(value) if name.endswith("seconds") else int(round(value)))
        by = {pair: row for pair, row in by.items() if any(row.values())}  # zeroed rows: nothing since a reset
        return cls(**values, errors=errors, by_codegen=by, zeroed_at=zeroed_at)  # type: ignore[arg-type]
