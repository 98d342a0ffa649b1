"""The codegen-cache command: look after a TVM codegen cache from the shell.

Every command takes --dir (the cache directory; default CODEGEN_CACHE_DIR, else the user
cache dir) and --json (print data as JSON), before or after the command name. The parser is
in _parser; exit codes are in _commands.EXIT_CODES and docs/cli.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from ._commands import (
    EXIT_CACHE,
    EXIT_CODES,
    EXIT_CONFIG,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    cmd_clear,
    cmd_ls,
    cmd_prune,
    cmd_show,
    cmd_verify,
    fmt_table,
    open_cache,
    print_json,
    require_writable,
)
from .._errors import CommandError, UncacheableError
from ._stats_report import cmd_stats
from ._parser import DEMO_CONFIGS, READS_A_CACHE, build_parser, expand_short_options  # noqa: F401  DEMO_CONFIGS: re-exported
from .._config import (
    ENV_VARS,
    FILE_ALIASES,
    FILE_SETTINGS,
    ConfigError,
    Settings,
    configure_logging,
    describe_settings,
    format_age,
    format_size,
    parse_age,
    redact_url,
    refuse_file_as_directory,
    settings_from_env,
    suggest_env_var,
    unknown_env_vars,
)
from .._config_file import FILE_NAME, write_config_file

# The exit codes are re-exported: scripts and tests name them from here.
__all__ = ["EXIT_CACHE", "EXIT_CODES", "EXIT_CONFIG", "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_NOT_FOUND", "EXIT_OK",
           "EXIT_PROBLEMS", "EXIT_USAGE", "COMMANDS", "build_parser", "main"]



def _input_errors() -> tuple[type[BaseException], ...]:
    from .._errors import PrepareError
    from .._errors import KernelSourceError

    return (KernelSourceError, PrepareError, ValueError, TypeError)


# ---- the commands whose work lives in their own module ----------------------------------------


def cmd_explain(args: argparse.Namespace, settings: Settings) -> int:
    """Why a lowering missed: the nearest stored entries and the key parts they differ in."""
    from ._explain import explain, render
    from ._kernel_files import load_module

    if args.model:
        from ._explain_model import explain_model_file, render_model

        try:
            cache = open_cache(settings)
            report = explain_model_file(cache, args.module, args.target)
        except (OSError, SyntaxError, ImportError, *_input_errors()) as err:
            raise CommandError(str(err), EXIT_INPUT) from None
        cache.close()
        if args.json:
            print_json(report)
        else:
            print("\n".join(render_model(report)))
        return EXIT_OK
    try:
        mod, target, kernel = load_module(args.module, args.target, kernel=args.kernel,
                                          lowered=args.lowered or None)
        cache = open_cache(settings)
        codegen = cache.resolve(target)
    except _input_errors() as err:
        raise CommandError(str(err), EXIT_INPUT) from None
    supported = [m for m in (True, False) if (codegen.build if m else codegen.build_without_compile) is not None]
    wanted = {"compiled": [True], "source": [False], "both": [True, False]}[args.mode]
    modes = [m for m in wanted if m in supported]
    if not modes:
        raise CommandError(f"codegen {codegen.name!r} has no {args.mode} mode", EXIT_INPUT)
    if args.build:
        from ._explain_build import explain_build

        if kernel is None:
            raise CommandError("--build explains codegen_cache.build of a kernel; this file holds a lowered module",
                               EXIT_INPUT)
        from ._kernel_files import parse_target

        report = explain_build(cache, kernel, parse_target(args.target), limit=args.limit)
    else:
        report = explain(cache, mod, target, modes=modes, limit=args.limit, kernel=kernel)
    cache.close()
    if args.json:
        print_json(report)
        return EXIT_OK
    print("\n".join(render(report)))
    return EXIT_OK


def cmd_warm(args: argparse.Namespace, settings: Settings) -> int:
    """Lower a file's kernels for each target in N worker processes; fills the compiled store."""
    from ._warm import default_workers, warm

    if settings.disable:
        raise ConfigError("CODEGEN_CACHE_DISABLE", "1", "unset or 0 to warm: with caching off, warm would store "
                          "nothing")
    if settings.read_only:
        raise ConfigError("read_only (CODEGEN_CACHE_READ_ONLY or cache.conf)", "1", "unset or 0 to warm: a "
                          "read-only cache stores nothing")
    require_writable(args, settings)
    workers = default_workers() if args.workers is None else args.workers
    try:
        summary = warm(args.kernels, args.target, str(settings.directory), workers=workers, mode=args.mode,
                       names=args.kernel or None, progress=False if args.no_progress or args.json else None)
    except _input_errors() as err:
        raise CommandError(str(err), EXIT_INPUT) from None
    if args.json:
        print_json(summary)
    else:
        for r in summary["results"]:
            if r["status"] == "failed":
                print(f"FAILED  {r['kernel']} for {r['target']} ({r['mode']}): {r['error']}")
            elif r["status"] == "uncacheable":
                print(f"NOT CACHED  {r['kernel']} for {r['target']} ({r['mode']}): it reads an input the key "
                      "cannot hold (the warning above names it)")
        print(f"warmed {summary['tasks']} lowerings in {summary['seconds']:.1f} s with {summary['workers']} "
              f"workers: {summary['codegen']} ran the codegen, {summary['hit']} already cached, "
              f"{summary['uncacheable']} not cacheable, {summary['failed']} failed")
    return EXIT_PROBLEMS if summary["failed"] or summary["uncacheable"] else EXIT_OK


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    """Key determinism across fresh processes, the cache filesystem, the toolchain."""
    from ._doctor import doctor, render

    if args.target:
        from ._kernel_files import parse_target

        try:
            for text in args.target:  # checked here: in the determinism check's processes it would be a traceback
                parse_target(text)
        except (ValueError, TypeError) as err:
            raise CommandError(str(err), EXIT_INPUT) from None
    report = doctor(settings, processes=args.processes, kernels=args.kernels, targets=args.target)
    if args.json:
        print_json(report)
        return EXIT_PROBLEMS if report["problems"] else EXIT_OK
    print("\n".join(render(report)))
    return EXIT_PROBLEMS if report["problems"] else EXIT_OK


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """The autotuning-style sweep, cold then warm, as a table."""
    from ._demo import run_demo

    directory = None
    if args.dir is not None:
        directory = settings.directory
        require_writable(args, settings)
    result = run_demo(directory, nvcc_configs=args.nvcc_configs,
                      progress=False if args.no_progress or args.json else None,
                      out=None if args.json else print)
    if args.json:
        print_json(result)
    return EXIT_OK


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """Every setting: its variable, value, where the value came from, and its default; or --set/--unset."""
    refuse_file_as_directory(settings.directory, "--dir" if args.dir is not None else "CODEGEN_CACHE_DIR")
    if args.set or args.unset:
        return _set_config(args, settings)
    rows = [_redacted(r) for r in describe_settings(directory=args.dir)]
    unknown = unknown_env_vars()
    if args.json:
        print_json({"settings": [r._asdict() for r in rows], "unknown_env_vars": unknown,
                    "suggestions": {var: suggest_env_var(var) for var in unknown},
                    "config_file": str(settings.directory / FILE_NAME)})
        return EXIT_OK
    table = [["VARIABLE", "VALUE", "FROM", "DEFAULT"]]
    for r in rows:
        table.append([r.variable, _show_value(r.field, r.value), r.origin, _show_value(r.field, r.default)])
    print("\n".join(fmt_table(table)))
    for var in unknown:
        close = suggest_env_var(var)
        print(f"WARNING: {var} is set but is not a codegen-cache setting" +
              (f" (did you mean {close}?)" if close else " (a typo?)"))
    return EXIT_OK


def _set_config(args: argparse.Namespace, settings: Settings) -> int:
    """--set NAME=VALUE / --unset NAME: the directory's cache.conf, written for every process that uses it."""
    updates: dict[str, str | None] = {}
    for name in args.unset:
        field = FILE_ALIASES.get(name, name)
        if field not in FILE_SETTINGS:
            raise ConfigError("--unset", name, "one of " + ", ".join((*FILE_SETTINGS, *FILE_ALIASES)))
        updates[field] = None
    for field, value in args.set:
        updates[field] = value
    require_writable(args, settings)
    path = write_config_file(settings.directory, updates)
    if args.json:
        print_json({"config_file": str(path), "set": {f: v for f, v in updates.items() if v is not None},
                    "unset": [f for f, v in updates.items() if v is None]})
        return EXIT_OK
    for field, value in updates.items():
        shown = "(unset)" if value is None else _show_value(field, getattr(settings_from_env(**{field: value}), field))
        print(f"{field} = {shown} in {path}")
    return EXIT_OK


def _redacted(row):
    """The row with secrets hidden: the HMAC key, and a password in the remote URL."""
    if row.field == "remote_secret" and row.value:
        return row._replace(value="***")
    if row.field == "remote" and row.value:
        return row._replace(value=redact_url(str(row.value)))
    return row


# Settings parsed as durations ("14d"): shown the way they are written.
_DURATIONS = frozenset(field for field, parse, _doc in ENV_VARS.values() if parse is parse_age)


def _show_value(field: str, value: object) -> str:
    if value is None or value == ():
        return "(unset)"
    if isinstance(value, tuple):
        return os.pathsep.join(map(str, value))  # trusted_dirs, as the variable is written
    if field.endswith(("_limit", "_bytes")):
        return format_size(int(value))  # type: ignore[arg-type]
    if field in _DURATIONS:
        return format_age(float(value))  # type: ignore[arg-type]
    return str(value)


# ---- main ---------------------------------------------------------------------------------------

COMMANDS = {"stats": cmd_stats, "ls": cmd_ls, "show": cmd_show, "explain": cmd_explain, "clear": cmd_clear,
            "prune": cmd_prune, "verify": cmd_verify, "warm": cmd_warm, "doctor": cmd_doctor, "demo": cmd_demo,
            "config": cmd_config}



def main(argv: list[str] | None = None) -> int:
    """Entry point of `codegen-cache`; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(expand_short_options(sys.argv[1:] if argv is None else argv))
    except SystemExit as done:  # usage errors (2), --help (0)
        return int(done.code or 0)
    if args.command == "demo" and args.nvcc_configs is None:
        from ._demo import DEFAULT_NVCC_CONFIGS

        args.nvcc_configs = DEFAULT_NVCC_CONFIGS
    try:
        if args.dir is not None and not str(args.dir).strip():
            raise ConfigError("--dir", args.dir, "a directory path")
        settings = settings_from_env(directory=args.dir)
        if args.dir is not None and args.command in READS_A_CACHE and not settings.directory.exists():
            # A mistyped --dir must not read as an empty cache ("removed 0 entries").
            raise ConfigError("--dir", args.dir, "an existing cache directory (this path does not exist; "
                              "warm, demo or a lowering create one)")
        configure_logging(settings)
        return COMMANDS[args.command](args, settings)
    except ConfigError as err:
        print(f"codegen-cache: error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except CommandError as err:
        print(f"codegen-cache {args.command}: {err}", file=sys.stderr)
        return err.code
    except UncacheableError as err:
        # A kernel file registered a callback the key cannot hold: nothing to look up or warm.
        print(f"codegen-cache {args.command}: {err}", file=sys.stderr)
        return EXIT_INPUT
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
    from .._storage._disk import STORAGE_ERRORS

    return STORAGE_ERRORS


