"""What the maintenance commands do: ls, show, clear, prune, verify (stats: _stats_report).

Also what every command shares: exit codes, CommandError, output helpers. The parser,
main() and the thin explain/warm/doctor/demo/config commands are in _cli.py; explain, warm,
doctor and demo keep their work in their own modules.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from .._config import Settings, check_directory, describe_settings, format_age, format_size
from .._artifacts._packed import unpack as unpack_ir
from .._errors import ArtifactError, CommandError
from .._storage._faults import writable

__all__ = [
    "EXIT_CODES",
    "CommandError",
    "chosen_stores",
    "cmd_clear",
    "cmd_ls",
    "cmd_prune",
    "cmd_show",
    "cmd_verify",
    "fmt_age",
    "fmt_seconds",
    "fmt_table",
    "fmt_when",
    "open_cache",
    "plural",
    "print_json",
    "require_writable",
]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_NOT_FOUND = 4
EXIT_INPUT = 5
EXIT_CACHE = 6
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_PROBLEMS: "problems found: verify found bad entries, doctor a problem, warm a kernel that failed",
    EXIT_USAGE: "usage error: unknown command or option, or a bad option value",
    EXIT_CONFIG: "configuration error: a setting (CODEGEN_CACHE_* or --dir) is not accepted, the cache "
                 "directory cannot be created or written, or a --dir to read does not exist",
    EXIT_NOT_FOUND: "not found: no entry matches the key (or the prefix matches several)",
    EXIT_INPUT: "input error: the kernels file or module cannot be loaded or has no such kernel, a target is "
                "invalid, the kernel cannot be lowered for it, or its lowering reads an input the key cannot hold (uncacheable)",
    EXIT_CACHE: "the cache could not be read or written (I/O or database error)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


# ---- output helpers -------------------------------------------------------------------------


def print_json(data: Any) -> None:
    """Print `data` as indented JSON (anything not JSON-native as its str)."""
    print(json.dumps(data, indent=2, default=str))


def plural(count: int, one: str, many: str) -> str:
    """'1 entry', '0 entries', '2 entries'."""
    return f"{count} {one if count == 1 else many}"


def fmt_seconds(value: float | None) -> str:
    """0.0123 -> '12.3 ms', 3.2 -> '3.20 s'."""
    if value is None:
        return "-"
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def fmt_age(created: float | None) -> str:
    """How long ago a timestamp was, e.g. '3h'."""
    return "-" if created is None else format_age(max(0.0, time.time() - created))


def fmt_when(created: float | None) -> str:
    """A timestamp as local date and time, with its age."""
    if created is None:
        return "-"
    return f"{datetime.fromtimestamp(created).isoformat(sep=' ', timespec='seconds')} ({fmt_age(created)} ago)"


def fmt_table(rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    """Rows as aligned columns (the `right` ones right-aligned)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


# ---- shared steps -----------------------------------------------------------------------------


def open_cache(settings: Settings, *, remote: bool = False, promote: bool = True, changes: bool = False):
    """The cache at the settings' directory (without the remote tier unless asked).

    promote: first move what stopped processes left staged into their stores (tools see all);
    not where the command must change nothing (a dry run), nor where the directory is read-only.
    changes: the command is asked to change the directory (clear, prune, verify --fix): a
    CODEGEN_CACHE_READ_ONLY meant for the processes that use the cache does not stop it.
    """
    from .._cache._cache import CodegenCache

    if changes:
        settings = dataclasses.replace(settings, read_only=False)
    elif not settings.read_only and settings.directory.is_dir() and not writable(settings.directory):
        # Read where it cannot be written: a read-only user of the directory, not a fault to warn about.
        settings = dataclasses.replace(settings, read_only=True)
    push_to = None
    if not remote:
        # No lookups in the remote, but what this directory's processes left unpushed goes there.
        push_to = None if settings.remote_read_only else settings.remote
        settings = dataclasses.replace(settings, remote=None)
    cache = CodegenCache(settings=settings, write_behind=False)
    if promote and not cache.read_only:
        cache.promote_staged(remote=push_to)  # entries of processes that stopped before moving them into their store
    return cache


def _dir_setting(args: argparse.Namespace) -> str:
    """What the user would change to pick another directory (for error messages)."""
    if args.dir is not None:
        return "--dir"
    origin = next(r.origin for r in describe_settings() if r.field == "directory")
    return "CODEGEN_CACHE_DIR" if origin == "environment" else "the default cache directory (set CODEGEN_CACHE_DIR)"


def require_writable(args: argparse.Namespace, settings: Settings) -> None:
    """ConfigError naming --dir or CODEGEN_CACHE_DIR unless the directory can be written."""
    check_directory(settings.directory, _dir_setting(args))


def chosen_stores(args: argparse.Namespace, default: tuple[str, ...]) -> tuple[str, ...]:
    """The stores picked with --compiled/--source/--failures/--tilelang, else `default`."""
    chosen = tuple(s for s in ("compiled", "source", "failures", "tilelang") if getattr(args, s, False))
    return chosen or default


# ---- the maintenance commands ---------------------------------------------------------------


def cmd_ls(args: argparse.Namespace, settings: Settings) -> int:
    """Entries with codegen, target, mode, size, age and codegen time."""
    from ._inventory import LISTED_STORES, iter_entries

    cache = open_cache(settings)
    entries = list(iter_entries(cache, chosen_stores(args, LISTED_STORES)))
    cache.close()
    order: dict[str, Callable] = {
        "age": lambda e: -(e.created or 0.0), "size": lambda e: -e.size, "key": lambda e: e.key,
        "codegen": lambda e: -float(e.meta.get("build_seconds") or 0.0),
    }
    entries.sort(key=order[args.sort])
    if args.json:
        print_json([e.as_dict() for e in entries])
        return EXIT_OK
    rows = [["KEY", "STORE", "CODEGEN", "TARGET", "FUNCTIONS", "SIZE", "AGE", "CODEGEN TIME"]]
    failed = [["KEY", "STORE", "CODEGEN", "ERROR", "SIZE", "AGE"]]
    for e in entries:
        if e.store == "failures":
            error = f"{e.meta.get('error_type', '?')}: {e.meta.get('message', '')}".splitlines()[0]
            failed.append([e.key[:16], e.store, str(e.codegen or "?"), _clip(error, 60),
                           format_size(e.size), fmt_age(e.created)])
            continue
        rows.append([e.key[:16], e.store, str(e.codegen or "?"), e.target,
                     _clip(",".join(e.functions) or "-", 32), format_size(e.size), fmt_age(e.created),
                     fmt_seconds(e.meta.get("build_seconds"))])
    if len(rows) > 1:
        print("\n".join(fmt_table(rows, right={5, 6, 7})))
    if len(failed) > 1:
        if len(rows) > 1:
            print()
        # Remembered codegen errors have no target or functions: their own table.
        print("\n".join(fmt_table(failed, right={4, 5})))
    print(f"{plural(len(entries), 'entry', 'entries')}, {format_size(sum(e.size for e in entries))}", file=sys.stderr)
    return EXIT_OK


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    """One entry in full: metadata, key parts, integrity, and with --code its source."""
    from .._artifacts import unframe
    from .._errors import ArtifactError
    from ._inventory import find_entries, open_store

    cache = open_cache(settings)
    found = find_entries(cache, args.key)
    if not found:
        raise CommandError(f"no entry in {cache.directory} has a key starting with {args.key!r}", EXIT_NOT_FOUND)
    if len(found) > 1:
        listed = "\n".join(f"  {e.key}  {e.store}" for e in found[:20])
        raise CommandError(f"{len(found)} entries match {args.key!r}; give more of the key:\n{listed}", EXIT_NOT_FOUND)
    entry = found[0]
    store = open_store(cache, entry.store)
    try:
        blob = (store.get(entry.key) if store is not None else None) or b""
        art = unframe(blob)
        integrity, code = "ok", _code_of(art)
    except ArtifactError as err:
        integrity, code = str(err), None
    finally:
        cache.close()
    data = {**entry.as_dict(), "integrity": integrity,
            **({"code": code} if args.code else {})}
    if args.json:
        print_json(data)
        return EXIT_OK
    lines = [
        ("key", entry.key),
        ("store", f"{entry.store}/  ({entry.codec}, {format_size(entry.size)}, frame and checksum: {integrity})"),
    ]
    if entry.store == "failures":
        lines += [("codegen", str(entry.meta.get("codegen"))),
                  ("error", f"{entry.meta.get('error_type')}: {entry.meta.get('message')}")]
    else:
        context = entry.meta.get("context") if isinstance(entry.meta.get("context"), dict) else {}
        lines += [("codegen", f"{entry.codegen}  mode {entry.meta.get('mode')}  module {entry.meta.get('module_kind')}"
                   if entry.store != "tilelang" else f"tilelang.compile  backend {context.get('backend')}  "
                   f"execution backend {context.get('execution_backend')}"),
                  ("target", entry.target),
                  ("functions", ", ".join(entry.functions) or "-"),
                  ("codegen time", fmt_seconds(entry.meta.get("build_seconds")))]
    lines.append(("created", fmt_when(entry.created)))
    for name, value in lines:
        print(f"{name:<12} {value}")
    if entry.parts:
        print("key parts")
        width = max(len(n) for n in entry.parts)
        for name, value in entry.parts.items():
            print(f"  {name:<{width}}  {value}")
    if args.code:
        print()
        print(code if code is not None else "(this entry holds no source text)")
    return EXIT_OK


def _code_of(art) -> str | None:
    """The source text an artifact holds (CUDA/C source, LLVM IR text), if any."""
    if art.codec in ("source", "c"):
        return art.fields[0].decode(errors="replace")
    if art.codec == "cuda-bin":
        return art.fields[3].decode(errors="replace") or None
    if art.codec == "cuda-fallback":  # function map, CUDA source
        return bytes(art.fields[1]).decode(errors="replace") or None
    if art.codec in ("llvm-ir", "llvm-so"):  # the IR is the last field, packed (_artifacts/_packed.py)
        try:
            return bytes(unpack_ir(art.fields[-1])).decode(errors="replace") or None
        except ArtifactError:
            return None
    if art.codec == "tilelang-kernel" and len(art.fields) == 3:  # library, device source, host source
        return bytes(art.fields[1]).decode(errors="replace") or None
    return None


def cmd_clear(args: argparse.Namespace, settings: Settings) -> int:
    """Remove every entry of the chosen stores (all three by default)."""
    chosen = chosen_stores(args, ("compiled", "source", "failures"))
    removed = 0
    if settings.directory.exists():
        if args.dry_run:
            removed = _entries_in(settings, chosen)
        else:
            require_writable(args, settings)
            cache = open_cache(settings, changes=True)
            removed = cache.clear(compiled="compiled" in chosen, source="source" in chosen,
                                  failures="failures" in chosen)
            cache.close()
    if args.json:
        print_json({"directory": str(settings.directory), "stores": list(chosen), "removed": removed,
                    "dry_run": args.dry_run})
    else:
        print(f"{'would remove' if args.dry_run else 'removed'} {plural(removed, 'entry', 'entries')} from "
              f"{', '.join(s + '/' for s in chosen)} in {settings.directory}")
    return EXIT_OK


def _entries_in(settings: Settings, chosen: tuple[str, ...]) -> int:
    """How many entries clear() would remove from the chosen stores (and what the index and tilelang/ hold
    with compiled/ or source/), counted without changing anything."""
    from ._inventory import open_store

    cache = open_cache(settings, promote=False)
    names = list(chosen) + (["index", "tilelang"] if {"compiled", "source"} & set(chosen) else [])
    count = 0
    for name in names:
        store = open_store(cache, name)
        count += len(store) if store is not None else 0
        if name in ("compiled", "source", "index"):
            count += sum(1 for _ in cache.staged(name).digests())
    cache.close()
    return count


def cmd_prune(args: argparse.Namespace, settings: Settings) -> int:
    """Remove entries older than an age, then the oldest until the stores (together) fit a size."""
    from ._inventory import LISTED_STORES, prune

    if args.max_size is None and args.older_than is None:
        raise CommandError("prune needs --max-size SIZE and/or --older-than AGE", EXIT_USAGE)
    chosen = chosen_stores(args, LISTED_STORES)
    result = {"removed": 0, "expired": 0, "freed_bytes": 0, "bytes_before": 0, "bytes_after": 0, "keys": []}
    if settings.directory.exists():
        if not args.dry_run:
            require_writable(args, settings)
        cache = open_cache(settings, promote=not args.dry_run, changes=not args.dry_run)
        result = prune(cache, max_size=args.max_size, older_than=args.older_than, stores=chosen,
                       dry_run=args.dry_run)
        cache.close()
    if args.json:
        print_json({"directory": str(settings.directory), "stores": list(chosen), **result, "dry_run": args.dry_run})
    elif args.dry_run:
        print(f"would remove {plural(result['removed'], 'entry', 'entries')} ({format_size(result['freed_bytes'])}); "
              f"{', '.join(s + '/' for s in chosen)} would hold {format_size(result['bytes_after'])} "
              f"(now {format_size(result['bytes_before'])})")
        for key in result["keys"]:
            print(f"  {key}")
    else:
        print(f"removed {plural(result['removed'], 'entry', 'entries')} ({format_size(result['freed_bytes'])}) and "
              f"{result['expired']} expired ones; {', '.join(s + '/' for s in chosen)} now "
              f"{format_size(result['bytes_after'])} (was {format_size(result['bytes_before'])})")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    """Check every entry's framing, checksum and key; --fix removes the bad ones."""
    from ._inventory import verify_entries

    if args.fix and settings.directory.exists():
        require_writable(args, settings)
    cache = open_cache(settings, changes=args.fix)
    result = verify_entries(cache, fix=args.fix)
    cache.close()
    if args.json:
        print_json({"directory": str(settings.directory), **result})
    else:
        for bad in result["bad"]:
            where = f"{bad['store']}/{bad['key'][:16] if bad['key'] else '?'}"
            print(f"BAD  {where}: {bad['problem']}" + ("  (removed)" if bad["removed"] else ""))
        print(f"checked {plural(result['checked'], 'entry', 'entries')}: {len(result['bad'])} bad, {result['removed']} removed")
        if result["bad"] and not args.fix:
            print("run `codegen-cache verify --fix` to remove them (the cache also drops a corrupt entry "
                  "when it reads one)")
    return EXIT_PROBLEMS if result["bad"] else EXIT_OK
