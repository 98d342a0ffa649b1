"""`codegen-cache stats`: entries and bytes per store, the counters as ccache shows them, and
with -v the counters per codegen and mode."""

from __future__ import annotations

import argparse

from .._config import Settings, format_size
from ._commands import EXIT_OK, fmt_seconds, fmt_table, fmt_when, open_cache, print_json, require_writable

__all__ = ["cmd_stats"]


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    """Entries and bytes per store, hits and misses per tier, errors, time saved."""
    from ._inventory import ALL_STORES, open_store

    cache = open_cache(settings)
    if args.reset:
        require_writable(args, settings)
        cache.reset_stats()
    limits = {"compiled": settings.compiled_size_limit, "source": settings.source_size_limit, "failures": None,
              # The frontend's entries are bounded by the compiled limit, on their own (_frontend._store).
              "builds": None, "tilelang": settings.compiled_size_limit}
    stores = {}
    for name in ALL_STORES:
        store = open_store(cache, name)
        stores[name] = {"entries": len(store) if store is not None else 0,
                        "bytes": store.volume() if store is not None else 0, "size_limit": limits[name]}
    stats = cache.stats().as_dict()
    lookups = stats["hits"] + stats["misses"]
    data = {"directory": str(cache.directory), "exists": cache.directory.is_dir(), "stores": stores,
            "counters": stats, "hit_rate": stats["hits"] / lookups if lookups else None}
    cache.close()
    if args.json:
        print_json(data)
        return EXIT_OK
    print(f"cache directory  {data['directory']}" + ("" if data["exists"] else "  (does not exist yet)"))
    rows = [["store", "entries", "size", "limit"]]
    rows += [[n, str(s["entries"]), format_size(s["bytes"]), format_size(s["size_limit"]) if s["size_limit"] else "-"]
             for n, s in stores.items()]
    print("\n".join(fmt_table(rows, right={1, 2, 3})))
    c = stats
    rate = f"{data['hit_rate']:.1%}" if data["hit_rate"] is not None else "-"
    print()
    print(f"hits        {c['hits']:>8}   memory {c['hits_memory']}, disk {c['hits_disk']}, remote {c['hits_remote']}")
    print(f"misses      {c['misses']:>8}   hit rate {rate}")
    print(f"builds      {c['builds']:>8}   codegen time {fmt_seconds(c['build_seconds'])}")
    print(f"stores      {c['stores']:>8}   skipped {c['stores_skipped']}")
    print(f"time saved  {fmt_seconds(c['saved_seconds']):>8}   (codegen time of the entries that hit)")
    other = {k: v for k, v in c.items() if isinstance(v, (int, float)) and v and k not in
             {"hits", "hits_memory", "hits_disk", "hits_remote", "misses", "builds", "stores", "stores_skipped",
              "build_seconds", "saved_seconds"}}
    if other:
        print("other       " + ", ".join(f"{k} {v}" for k, v in other.items()))
    errors = c["errors"]
    print("errors      " + (", ".join(f"{k} {v}" for k, v in sorted(errors.items())) if errors else "none"))
    print("zeroed      " + (fmt_when(c["zeroed_at"]) if c["zeroed_at"] is not None else "never (counting since the "
                             "first use of this directory)"))
    if args.verbose:
        print()
        print("\n".join(_breakdown(c["by_codegen"])))
    return EXIT_OK


def _breakdown(by_codegen: dict[str, dict[str, float]]) -> list[str]:
    """The per codegen and mode table of `stats -v`."""
    if not by_codegen:
        return ["per codegen and mode: nothing counted yet"]
    rows = [["CODEGEN", "MODE", "HITS", "MISSES", "BUILDS", "STORES", "UNCACHEABLE", "CODEGEN TIME", "SAVED"]]
    for pair, row in sorted(by_codegen.items()):
        codegen, _, mode = pair.rpartition("/")
        rows.append([codegen, mode, *(str(int(row[n])) for n in ("hits", "misses", "builds", "stores", "uncacheable")),
                     fmt_seconds(row["build_seconds"]), fmt_seconds(row["saved_seconds"])])
    return fmt_table(rows, right=set(range(2, 9)))
