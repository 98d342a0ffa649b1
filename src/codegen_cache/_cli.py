"""The codegen-cache command: look after a TVM codegen cache from the shell.

Every command takes --dir (the cache directory; default CODEGEN_CACHE_DIR, else the user
cache dir) and --json (print data as JSON), before or after the command name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ._config import (
    ConfigError,
    Settings,
    check_directory,
    configure_logging,
    describe_settings,
    format_age,
    format_size,
    parse_age,
    parse_size,
    redact_url,
    settings_from_env,
    unknown_env_vars,
)

__all__ = ["EXIT_CODES", "main"]

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
    EXIT_CONFIG: "configuration error: a setting (CODEGEN_CACHE_* or --dir) is not accepted, or the cache "
                 "directory cannot be created or written",
    EXIT_NOT_FOUND: "not found: no entry matches the key (or the prefix matches several)",
    EXIT_INPUT: "input error: the kernels file or module cannot be loaded or has no such kernel, a target is "
                "invalid, or the kernel cannot be lowered for it",
    EXIT_CACHE: "the cache could not be read or written (I/O or database error)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


class CommandError(Exception):
    """A command cannot do what was asked; its message is printed and `code` returned."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message, code)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message


# ---- output helpers -------------------------------------------------------------------------


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def _age(created: float | None) -> str:
    return "-" if created is None else format_age(max(0.0, time.time() - created))


def _when(created: float | None) -> str:
    if created is None:
        return "-"
    return f"{datetime.fromtimestamp(created).isoformat(sep=' ', timespec='seconds')} ({_age(created)} ago)"


def _table(rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


# ---- shared steps -----------------------------------------------------------------------------


def _open(settings: Settings, *, remote: bool = False):
    """The cache at the settings' directory (without the remote tier unless asked)."""
    from ._cache import CodegenCache

    if not remote:
        settings = dataclasses.replace(settings, remote=None)
    return CodegenCache(settings=settings, write_behind=False)


def _dir_setting(args: argparse.Namespace) -> str:
    """What the user would change to pick another directory (for error messages)."""
    if args.dir is not None:
        return "--dir"
    origin = next(r.origin for r in describe_settings() if r.field == "directory")
    return "CODEGEN_CACHE_DIR" if origin == "environment" else "the default cache directory (set CODEGEN_CACHE_DIR)"


def _writable(args: argparse.Namespace, settings: Settings) -> None:
    check_directory(settings.directory, _dir_setting(args))


def _stores(args: argparse.Namespace, default: tuple[str, ...]) -> tuple[str, ...]:
    chosen = tuple(s for s in ("compiled", "source", "failures") if getattr(args, s, False))
    return chosen or default


def _size_arg(text: str) -> int:
    try:
        return parse_size("--max-size", text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _age_arg(text: str) -> float:
    try:
        return parse_age("--older-than", text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _input_errors() -> tuple[type[BaseException], ...]:
    from ._errors import LoweringError
    from ._warm import KernelSourceError

    return (KernelSourceError, LoweringError, ValueError, TypeError)


# ---- commands ---------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    """Entries and bytes per store, hits and misses per tier, errors, time saved."""
    from ._inventory import ALL_STORES

    cache = _open(settings)
    if args.reset:
        _writable(args, settings)
        cache.reset_stats()
    limits = {"compiled": settings.compiled_size_limit, "source": settings.source_size_limit, "failures": None}
    stores = {}
    for name in ALL_STORES:
        present = (cache.directory / name).is_dir()
        store = cache.store(name)
        stores[name] = {"entries": len(store) if present else 0, "bytes": store.volume() if present else 0,
                        "size_limit": limits[name]}
    stats = cache.stats().as_dict()
    lookups = stats["hits"] + stats["misses"]
    data = {"directory": str(cache.directory), "exists": cache.directory.is_dir(), "stores": stores,
            "counters": stats, "hit_rate": stats["hits"] / lookups if lookups else None}
    cache.close()
    if args.json:
        _print_json(data)
        return EXIT_OK
    print(f"cache directory  {data['directory']}" + ("" if data["exists"] else "  (does not exist yet)"))
    rows = [["store", "entries", "size", "limit"]]
    rows += [[n, str(s["entries"]), format_size(s["bytes"]), format_size(s["size_limit"]) if s["size_limit"] else "-"]
             for n, s in stores.items()]
    print("\n".join(_table(rows, right={1, 2, 3})))
    c = stats
    rate = f"{data['hit_rate']:.1%}" if data["hit_rate"] is not None else "-"
    print()
    print(f"hits        {c['hits']:>8}   memory {c['hits_memory']}, disk {c['hits_disk']}, remote {c['hits_remote']}")
    print(f"misses      {c['misses']:>8}   hit rate {rate}")
    print(f"builds      {c['builds']:>8}   codegen time {_seconds(c['build_seconds'])}")
    print(f"stores      {c['stores']:>8}   skipped {c['stores_skipped']}")
    print(f"time saved  {_seconds(c['saved_seconds']):>8}   (codegen time of the entries that hit)")
    other = {k: v for k, v in c.items() if isinstance(v, (int, float)) and v and k not in
             {"hits", "hits_memory", "hits_disk", "hits_remote", "misses", "builds", "stores", "stores_skipped",
              "build_seconds", "saved_seconds"}}
    if other:
        print("other       " + ", ".join(f"{k} {v}" for k, v in other.items()))
    errors = c["errors"]
    print("errors      " + (", ".join(f"{k} {v}" for k, v in sorted(errors.items())) if errors else "none"))
    return EXIT_OK


def cmd_ls(args: argparse.Namespace, settings: Settings) -> int:
    """Entries with codegen, target, mode, size, age and build time."""
    from ._inventory import ENTRY_STORES, iter_entries

    cache = _open(settings)
    entries = list(iter_entries(cache, _stores(args, ENTRY_STORES)))
    cache.close()
    order: dict[str, Callable] = {
        "age": lambda e: -(e.created or 0.0), "size": lambda e: -e.size, "key": lambda e: e.key,
        "build": lambda e: -float(e.meta.get("build_seconds") or 0.0),
    }
    entries.sort(key=order[args.sort])
    if args.json:
        _print_json([e.as_dict() for e in entries])
        return EXIT_OK
    rows = [["KEY", "STORE", "CODEGEN", "TARGET", "FUNCTIONS", "SIZE", "AGE", "BUILD"]]
    for e in entries:
        funcs = ",".join(e.meta.get("func_names", [])) or (e.meta.get("error_type") or "-")
        rows.append([e.key[:16], e.store, str(e.meta.get("codegen", "?")), e.target if e.store != "failures" else "-",
                     funcs if len(funcs) <= 32 else funcs[:31] + "…", format_size(e.size), _age(e.created),
                     _seconds(e.meta.get("build_seconds"))])
    if len(rows) > 1:
        print("\n".join(_table(rows, right={5, 6, 7})))
    print(f"{len(entries)} entries, {format_size(sum(e.size for e in entries))}", file=sys.stderr)
    return EXIT_OK


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    """One entry in full: metadata, key parts, integrity, and with --code its source."""
    from ._artifacts import unframe
    from ._errors import ArtifactError
    from ._inventory import find_entries

    cache = _open(settings)
    found = find_entries(cache, args.key)
    if not found:
        raise CommandError(f"no entry in {cache.directory} has a key starting with {args.key!r}", EXIT_NOT_FOUND)
    if len(found) > 1:
        listed = "\n".join(f"  {e.key}  {e.store}" for e in found[:20])
        raise CommandError(f"{len(found)} entries match {args.key!r}; give more of the key:\n{listed}", EXIT_NOT_FOUND)
    entry = found[0]
    blob = cache.store(entry.store).get(entry.key) or b""
    cache.close()
    try:
        art = unframe(blob)
        integrity, code = "ok", _code_of(art)
    except ArtifactError as err:
        integrity, code = str(err), None
    data = {**entry.as_dict(), "integrity": integrity,
            **({"code": code} if args.code else {})}
    if args.json:
        _print_json(data)
        return EXIT_OK
    lines = [
        ("key", entry.key),
        ("store", f"{entry.store}/  ({entry.codec}, {format_size(entry.size)}, frame and checksum: {integrity})"),
    ]
    if entry.store == "failures":
        lines += [("codegen", str(entry.meta.get("codegen"))),
                  ("error", f"{entry.meta.get('error_type')}: {entry.meta.get('message')}")]
    else:
        lines += [("codegen", f"{entry.meta.get('codegen')}  mode {entry.meta.get('mode')}  "
                              f"module {entry.meta.get('module_kind')}"),
                  ("target", entry.target),
                  ("functions", ", ".join(entry.meta.get("func_names", [])) or "-"),
                  ("build time", _seconds(entry.meta.get("build_seconds")))]
    lines.append(("created", _when(entry.created)))
    for name, value in lines:
        print(f"{name:<11} {value}")
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
    return None


def cmd_explain(args: argparse.Namespace, settings: Settings) -> int:
    """Why a lowering missed: the nearest stored entries and the key parts they differ in."""
    from ._explain import explain, load_module

    try:
        mod, target, kernel = load_module(args.module, args.target, kernel=args.kernel,
                                          lowered=args.lowered or None)
        cache = _open(settings)
        entry = cache.resolve(target)
    except _input_errors() as err:
        raise CommandError(str(err), EXIT_INPUT) from None
    supported = [m for m in (True, False) if (entry.build if m else entry.build_without_compile) is not None]
    wanted = {"compiled": [True], "source": [False], "both": [True, False]}[args.mode]
    modes = [m for m in wanted if m in supported]
    if not modes:
        raise CommandError(f"codegen {entry.name!r} has no {args.mode} mode", EXIT_INPUT)
    report = explain(cache, mod, target, modes=modes, limit=args.limit, kernel=kernel)
    cache.close()
    if args.json:
        _print_json(report)
        return EXIT_OK
    print(f"cache {report['directory']}: {report['entries']} entries; functions {', '.join(report['func_names'])}")
    for m in report["modes"]:
        print()
        print(f"{m['mode']}: key {m['key']} -> {m['status'].upper()}")
        if m["status"] == "hit":
            print(f"  stored in {m['entry']['store']}/ {format_age(m['entry']['age_seconds'])} ago")
        for n in m["nearest"] if m["status"] != "hit" else []:
            print(f"  {n['key'][:16]} {n['store']:<8} shares {n['shared']}/{n['parts']} parts, "
                  f"{_age(n['created'])} old: {n['summary']}")
        if m["status"] != "hit" and len(m["patterns"]) > 1:
            print("  all stored entries, by what differs:")
            for p in m["patterns"]:
                print(f"    {p['entries']:>5}  {', '.join(p['differs']) or '(nothing)'}")
        for line in m["verdict"]:
            print(f"  why: {line}" if m["status"] != "hit" else f"  {line}")
    return EXIT_OK


def cmd_clear(args: argparse.Namespace, settings: Settings) -> int:
    """Remove every entry of the chosen stores (all three by default)."""
    chosen = _stores(args, ("compiled", "source", "failures"))
    removed = 0
    if settings.directory.exists():
        _writable(args, settings)
        cache = _open(settings)
        removed = cache.clear(compiled="compiled" in chosen, source="source" in chosen,
                              failures="failures" in chosen)
        cache.close()
    if args.json:
        _print_json({"directory": str(settings.directory), "stores": list(chosen), "removed": removed})
    else:
        print(f"removed {removed} entries from {', '.join(s + '/' for s in chosen)} in {settings.directory}")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace, settings: Settings) -> int:
    """Remove entries older than an age, then the oldest until the stores fit a size."""
    from ._inventory import ENTRY_STORES, prune

    if args.max_size is None and args.older_than is None:
        raise CommandError("prune needs --max-size SIZE and/or --older-than AGE", EXIT_USAGE)
    chosen = _stores(args, ENTRY_STORES)
    result = {"removed": 0, "expired": 0, "freed_bytes": 0, "bytes_before": 0, "bytes_after": 0, "keys": []}
    if settings.directory.exists():
        _writable(args, settings)
        cache = _open(settings)
        result = prune(cache, max_size=args.max_size, older_than=args.older_than, stores=chosen)
        cache.close()
    if args.json:
        _print_json({"directory": str(settings.directory), "stores": list(chosen), **result})
    else:
        print(f"removed {result['removed']} entries ({format_size(result['freed_bytes'])}) and "
              f"{result['expired']} expired ones; {', '.join(s + '/' for s in chosen)} now "
              f"{format_size(result['bytes_after'])} (was {format_size(result['bytes_before'])})")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    """Check every entry's framing, checksum and key; --fix removes the bad ones."""
    from ._inventory import verify_entries

    if args.fix and settings.directory.exists():
        _writable(args, settings)
    cache = _open(settings)
    result = verify_entries(cache, fix=args.fix)
    cache.close()
    if args.json:
        _print_json({"directory": str(settings.directory), **result})
    else:
        for bad in result["bad"]:
            where = f"{bad['store']}/{bad['key'][:16] if bad['key'] else '?'}"
            print(f"BAD  {where}: {bad['problem']}" + ("  (removed)" if bad["removed"] else ""))
        print(f"checked {result['checked']} entries: {len(result['bad'])} bad, {result['removed']} removed")
        if result["bad"] and not args.fix:
            print("run `codegen-cache verify --fix` to remove them (the cache also drops a corrupt entry "
                  "when it reads one)")
    return EXIT_PROBLEMS if result["bad"] else EXIT_OK


def cmd_warm(args: argparse.Namespace, settings: Settings) -> int:
    """Lower a file's kernels for each target in N worker processes; fills the compiled store."""
    from ._warm import default_workers, warm

    _writable(args, settings)
    workers = default_workers() if args.workers is None else args.workers
    try:
        summary = warm(args.kernels, args.target, str(settings.directory), workers=workers, mode=args.mode,
                       names=args.kernel or None, progress=False if args.no_progress or args.json else None)
    except _input_errors() as err:
        raise CommandError(str(err), EXIT_INPUT) from None
    if args.json:
        _print_json(summary)
    else:
        for r in summary["results"]:
            if r["status"] == "failed":
                print(f"FAILED  {r['kernel']} for {r['target']} ({r['mode']}): {r['error']}")
        print(f"warmed {summary['tasks']} lowerings in {summary['seconds']:.1f} s with {summary['workers']} "
              f"workers: {summary['built']} built, {summary['hit']} already cached, {summary['failed']} failed")
    return EXIT_PROBLEMS if summary["failed"] else EXIT_OK


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    """Key determinism across fresh processes, the cache filesystem, the toolchain."""
    from ._doctor import doctor

    report = doctor(settings, processes=args.processes, kernels=args.kernels, targets=args.target)
    if args.json:
        _print_json(report)
        return EXIT_PROBLEMS if report["problems"] else EXIT_OK
    det = report.get("determinism")
    if det is not None:
        print(f"key determinism: {len(det['samples'])} sample lowerings in {det['processes']} fresh processes "
              f"(PYTHONHASHSEED {', '.join(det['seeds'])}), each lowered twice")
        if not det["unstable"] and not det["errors"]:
            print("  ok: every key part is the same in every process and on every lowering")
        for u in det["unstable"]:
            print(f"  NOT DETERMINISTIC: part {u['part']!r} of {u['sample']} differs {u['where']}: every run "
                  "computes another key, so it always misses")
        for e in det["errors"]:
            print(f"  ERROR: {e}")
    fs = report["filesystem"]
    free = format_size(fs["free_bytes"]) if fs["free_bytes"] is not None else "unknown"
    print(f"filesystem: {fs['directory']}" + ("" if fs["exists"] else " (not created yet)"))
    print(f"  {fs['fs_type']} mounted at {fs['mount_point']}: {'network' if fs['is_network'] else 'local'}, "
          f"{'read-only' if fs['read_only'] else 'writable'}, {'noexec' if fs['noexec'] else 'exec'}, {free} free")
    for p in fs["problems"]:
        print(f"  WARNING: {p}")
    if not fs["problems"]:
        print("  ok: a local, writable filesystem with room for the size limits")
    tool = report["toolchain"]
    print(f"toolchain: tvm {tool['tvm']}, tvm-ffi {tool['tvm_ffi']}, LLVM {tool['llvm']}")
    for note in tool["notes"]:
        print(f"  {note}")
    for var in report["unknown_env_vars"]:
        print(f"configuration: WARNING: {var} is set but is not a codegen-cache setting (a typo?)")
    problems = report["problems"]
    print(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found" if problems else "no problems found")
    return EXIT_PROBLEMS if problems else EXIT_OK


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """The autotuning-style sweep, cold then warm, as a table."""
    from ._demo import run_demo

    directory = None
    if args.dir is not None:
        directory = settings.directory
        _writable(args, settings)
    result = run_demo(directory, nvcc_configs=args.nvcc_configs,
                      progress=False if args.no_progress or args.json else None,
                      out=None if args.json else print)
    if args.json:
        _print_json(result)
    return EXIT_OK


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """Every setting: its variable, value, where the value came from, and its default."""
    rows = [_redacted(r) for r in describe_settings(directory=args.dir)]
    unknown = unknown_env_vars()
    if args.json:
        _print_json({"settings": [dataclasses.asdict(r) for r in rows], "unknown_env_vars": unknown})
        return EXIT_OK
    table = [["VARIABLE", "VALUE", "FROM", "DEFAULT"]]
    for r in rows:
        table.append([r.variable, _show_value(r.field, r.value), r.origin, _show_value(r.field, r.default)])
    print("\n".join(_table(table)))
    for var in unknown:
        print(f"WARNING: {var} is set but is not a codegen-cache setting (a typo?)")
    return EXIT_OK


def _redacted(row):
    """The row with secrets hidden: the HMAC key, and a password in the remote URL."""
    if row.field == "remote_secret" and row.value:
        return dataclasses.replace(row, value="***")
    if row.field == "remote" and row.value:
        return dataclasses.replace(row, value=redact_url(str(row.value)))
    return row


def _show_value(field: str, value: object) -> str:
    if value is None:
        return "(unset)"
    if field.endswith(("_limit", "_bytes")):
        return format_size(int(value))  # type: ignore[arg-type]
    if field in ("lease_timeout", "lease_wait", "failure_ttl", "remote_ttl"):
        return format_age(float(value))  # type: ignore[arg-type]
    return str(value)


# ---- parser and main ----------------------------------------------------------------------------


def _epilog() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `codegen-cache`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", default=argparse.SUPPRESS, help="cache directory (default: CODEGEN_CACHE_DIR, "
                        "else the user cache dir)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print data as JSON")
    parser = argparse.ArgumentParser(prog="codegen-cache", description="Look after a TVM codegen cache.",
                                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="cache directory (default: CODEGEN_CACHE_DIR, else the user "
                        "cache dir)")
    parser.add_argument("--json", action="store_true", default=False, help="print data as JSON")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text, epilog=_epilog(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    def store_flags(p: argparse.ArgumentParser, failures: bool = True) -> None:
        p.add_argument("--compiled", action="store_true", help="the compiled store (compile_device=True)")
        p.add_argument("--source", action="store_true", help="the source-only store (compile_device=False)")
        if failures:
            p.add_argument("--failures", action="store_true", help="the failure cache (codegen errors)")

    p = add("stats", cmd_stats, "entries and bytes per store, hits and misses per tier, errors, time saved")
    p.add_argument("--reset", action="store_true", help="zero the counters (entries stay)")
    p = add("ls", cmd_ls, "list entries: codegen, target, mode, size, age, build time")
    store_flags(p)
    p.add_argument("--sort", choices=("age", "size", "build", "key"), default="age",
                   help="order (default: newest first)")
    p = add("show", cmd_show, "one entry in full, with its key parts")
    p.add_argument("key", metavar="KEY", help="the key or a unique prefix of it")
    p.add_argument("--code", action="store_true", help="also print the stored source (CUDA/C source)")
    p = add("explain", cmd_explain, "why a lowering misses: the nearest entries and the key parts that differ")
    p.add_argument("module", metavar="FILE", help="a .py file or module of TVMScript kernels, or a TVMScript "
                   "text file")
    p.add_argument("-t", "--target", help="target: 'llvm', 'cuda -arch=sm_90' or JSON (optional for a "
                   "lowered module)")
    p.add_argument("--kernel", help="which kernel, when the file has several")
    p.add_argument("--mode", choices=("compiled", "source", "both"), default="both",
                   help="compile_device=True, False, or both (default)")
    p.add_argument("--lowered", action="store_true", help="the module is a codegen input already (detected "
                   "when every function has a target)")
    p.add_argument("--limit", type=int, default=3, help="nearest entries to show (default 3)")
    p = add("clear", cmd_clear, "remove every entry (of the chosen stores; all by default)")
    store_flags(p)
    p = add("prune", cmd_prune, "remove old entries, or the oldest until the stores fit a size")
    p.add_argument("--max-size", type=_size_arg, metavar="SIZE", help="e.g. 2G: remove the oldest entries "
                   "until the stores hold at most this")
    p.add_argument("--older-than", type=_age_arg, metavar="AGE", help="e.g. 30d: remove entries written "
                   "longer ago")
    store_flags(p, failures=False)
    p = add("verify", cmd_verify, "check every entry's framing, checksum and key")
    p.add_argument("--fix", action="store_true", help="remove the bad entries")
    p = add("warm", cmd_warm, "lower a file's kernels for targets in worker processes (progress bar)")
    p.add_argument("kernels", metavar="KERNELS", help="a .py file or module exposing kernels/variants "
                   "(or PrimFuncs)")
    p.add_argument("-t", "--target", action="append", required=True, help="target (repeatable): 'llvm', "
                   "'cuda -arch=sm_90' or JSON")
    p.add_argument("-j", "--workers", type=int, default=None, help="worker processes (default: one per CPU; "
                   "0: in this process)")
    p.add_argument("--mode", choices=("auto", "compiled", "source", "both"), default="auto",
                   help="auto (default): compiled where the codegen compiles, else source")
    p.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p = add("doctor", cmd_doctor, "check key determinism, the cache filesystem and the toolchain")
    p.add_argument("--processes", type=int, default=3, help="fresh processes for the determinism check "
                   "(default 3; 0 skips it)")
    p.add_argument("--kernels", help="also check the keys of this file's kernels (with --target)")
    p.add_argument("-t", "--target", action="append", help="targets for --kernels (repeatable)")
    p = add("demo", cmd_demo, "an autotuning-style sweep lowered cold, then warm: a table of times and hits")
    p.add_argument("--nvcc-configs", type=int, default=None, metavar="N",
                   help="how many of the 54 CUDA configs nvcc compiles (default 18; 0: none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add("config", cmd_config, "every setting: value, where it came from, default")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `codegen-cache`; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # usage errors (2), --help (0)
        return int(done.code or 0)
    if args.command == "demo" and args.nvcc_configs is None:
        from ._demo import DEFAULT_NVCC_CONFIGS

        args.nvcc_configs = DEFAULT_NVCC_CONFIGS
    try:
        if args.dir is not None and not str(args.dir).strip():
            raise ConfigError("--dir", args.dir, "a directory path")
        settings = settings_from_env(directory=args.dir)
        configure_logging(settings)
        return args.func(args, settings)
    except ConfigError as err:
        print(f"codegen-cache: error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except CommandError as err:
        print(f"codegen-cache {args.command}: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print("codegen-cache: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return EXIT_OK
    except _storage_errors() as err:
        print(f"codegen-cache {args.command}: cannot read or write the cache: {type(err).__name__}: {err}",
              file=sys.stderr)
        return EXIT_CACHE


def _storage_errors() -> tuple[type[BaseException], ...]:
    from ._store import STORAGE_ERRORS

    return STORAGE_ERRORS


if __name__ == "__main__":
    sys.exit(main())
