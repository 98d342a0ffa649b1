"""`codegen-cache stats`: entries and bytes per store, the counters as ccache shows them, and
with -v the counters per row (codegen and mode; "build/build" a TIR build, "relax.build/model" a
Relax compile), each call counted once in one row (_cache/_stats.py), and their sum, which is
the summary's hits, misses, codegen runs, stores and time saved."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from .._config import Settings, format_size
from .._storage._faults import writable
from ._commands import EXIT_OK, fmt_seconds, fmt_table, fmt_when, open_cache, print_json, require_writable

__all__ = ["OTHER_COUNTERS", "cmd_stats", "disk_usage"]

# The counters `stats` shows under "other" when they are not zero, each with what it counts
# (docs/cli.md; the remote ones also in docs/remote.md).
OTHER_COUNTERS = {
    "uncacheable": "lowerings the cache stepped aside for (an input it cannot key, a callback without a salt)",
    "evictions": "entries evicted from the disk stores to keep their size limits",
    "evictions_memory": "modules dropped from the in-process memory tier",
    "collisions": "disk or remote hits refused as another module under the same key (verify=True)",
    "corrupt": "damaged entries dropped and rebuilt",
    "failures_stored": "codegen errors remembered in failures/",
    "failures_served": "lowerings that raised a remembered codegen error instead of running the codegen",
    "mutations": "fresh modules not kept in memory because the codegen changed its input",
    "lease_waits": "misses that waited for another process's build of the same key",
    "upgrades": "llvm entries linked into shared libraries by the background upgrader after their store "
                "(later hits load the library)",
    "remote_stores": "values written to Redis (an llvm library and its IR count one each)",
    "remote_rejected": "remote values refused (envelope, signature, frame or checksum, or over the size cap)",
    "remote_misses": "Redis lookups that found no entry",
    "remote_skipped": "remote writes not attempted: the entry is over the size cap",
    "remote_offline": "remote calls skipped while their kind of call was backing off",
    "remote_kept": "remote writes that found a value under the key and left it",
    "remote_replaced": "damaged remote values replaced by a rebuild",
    "remote_refreshed": "remote TTLs extended by hits",
    "remote_lease_waits": "cold misses that waited for another host's build lease",
}


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    """Entries and bytes per store, hits and misses per tier, errors, time saved."""
    from ._inventory import ALL_STORES, open_store

    cache = open_cache(settings)
    if args.reset:
        require_writable(args, settings)
        cache.reset_stats()
    limits = {"compiled": settings.compiled_size_limit, "source": settings.source_size_limit, "failures": None,
              # The frontend's entries are bounded by the compiled limit, on their own (_frontend._store).
              "index": None, "tilelang": settings.compiled_size_limit}
    stores = {}
    for name in ALL_STORES:
        store = open_store(cache, name)
        stores[name] = {"entries": len(store) if store is not None else 0,
                        "bytes": store.volume() if store is not None else 0,
                        "size_limit": limits[name]}
    stats = cache.stats().as_dict()
    lookups = stats["hits"] + stats["misses"]
    # Counts of a process that cannot write here stay in its memory: this user's are not kept.
    counts_kept = not cache.directory.is_dir() or writable(cache.directory / "stats")
    data = {"directory": str(cache.directory), "exists": cache.directory.is_dir(), "stores": stores,
            "read_only": cache.read_only,
            "counts_kept": counts_kept, "counters": stats, "hit_rate": stats["hits"] / lookups if lookups else None}
    cache.close()
    # Measured once the stores are closed: an open SQLite database has write-ahead files beside it.
    data["bytes_on_disk"] = disk_usage(cache.directory)
    for name, store in stores.items():
        store["bytes_on_disk"] = disk_usage(cache.directory / name)
    if args.json:
        print_json(data)
        return EXIT_OK
    print(f"cache directory  {data['directory']}" + ("" if data["exists"] else "  (does not exist yet)") +
          ("  (read-only: hits are served, nothing is stored)" if data["exists"] and data["read_only"] else ""))
    print(f"on disk          {format_size(data['bytes_on_disk'])}  (du: every file of the directory, "
          "the stores' indexes, staged entries, locks and counters included)")
    rows = [["store", "entries", "entry bytes", "on disk", "limit"]]
    rows += [[n, str(s["entries"]), format_size(s["bytes"]), format_size(s["bytes_on_disk"]),
              format_size(s["size_limit"]) if s["size_limit"] else "-"] for n, s in stores.items()]
    print("\n".join(fmt_table(rows, right={1, 2, 3, 4})))
    c = stats
    rate = f"{data['hit_rate']:.1%}" if data["hit_rate"] is not None else "-"
    print()
    print(f"hits        {c['hits']:>8}   memory {c['hits_memory']}, disk {c['hits_disk']}, remote {c['hits_remote']}")
    print(f"misses      {c['misses']:>8}   hit rate {rate}")
    print(f"codegen runs{c['codegen_runs']:>8}   codegen time {fmt_seconds(c['codegen_seconds'])}")
    print(f"stores      {c['stores']:>8}   skipped {c['stores_skipped']}")
    print(f"time saved  {fmt_seconds(c['saved_seconds']):>8}   (what the calls served replaced, once each: a model's whole compile)")
    other = [(name, c[name]) for name in OTHER_COUNTERS if c.get(name)]
    for i, (name, value) in enumerate(other):
        print(f"{'other' if i == 0 else '':<12}{name} {value}: {OTHER_COUNTERS[name]}")
    errors = c["errors"]
    print("errors      " + (", ".join(f"{k} {v}" for k, v in sorted(errors.items())) if errors else "none"))
    if not data["counts_kept"]:
        print("not kept    the counts of processes that cannot write this directory (this user's): they "
              "count in memory only")
    print("zeroed      " + (fmt_when(c["zeroed_at"]) if c["zeroed_at"] is not None else "never (counting since the "
                             "first use of this directory)"))
    if args.verbose:
        print()
        print("\n".join(_breakdown(c["by_codegen"])))
    return EXIT_OK


def disk_usage(path: Path) -> int:
    """Bytes the files under `path` take on disk, as `du -s` counts them (blocks; a hard link once; no link followed)."""
    total, seen, stack = 0, set(), [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    try:
        total += os.lstat(path).st_blocks * 512  # the directory itself, as du counts it
    except OSError:
        pass
    return total


def _breakdown(by_codegen: dict[str, dict[str, float]]) -> list[str]:
    """The per codegen and mode table of `stats -v`, with a last row of their sums (the summary's values)."""
    if not by_codegen:
        return ["per codegen and mode: nothing counted yet"]
    counts = ("hits", "misses", "codegen_runs", "stores", "uncacheable")
    rows = [["CODEGEN", "MODE", "HITS", "MISSES", "CODEGEN RUNS", "STORES", "UNCACHEABLE", "CODEGEN TIME", "SAVED"]]
    for pair, row in sorted(by_codegen.items()):
        codegen, _, mode = pair.rpartition("/")
        rows.append([codegen, mode, *(str(int(row[n])) for n in counts),
                     fmt_seconds(row["codegen_seconds"]), fmt_seconds(row["saved_seconds"])])
    rows.append(["total", "", *(str(int(sum(row[n] for row in by_codegen.values()))) for n in counts),
                 *(fmt_seconds(sum(row[n] for row in by_codegen.values())) for n in ("codegen_seconds", "saved_seconds"))])
    return fmt_table(rows, right=set(range(2, 9)))
