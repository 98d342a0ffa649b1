"""The codegen-cache command: look after a TVM codegen cache from the shell.

Every command takes --dir (the cache directory; default CODEGEN_CACHE_DIR, else the user
cache dir) and --json (print data as JSON), before or after the command name. Exit codes are
in _commands.EXIT_CODES and docs/cli.md.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    cmd_stats,
    cmd_verify,
    fmt_table,
    open_cache,
    print_json,
    require_writable,
)
from .._errors import CommandError
from .._version import __version__
from .._config import (
    ENV_VARS,
    ConfigError,
    Settings,
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

# The exit codes are re-exported: scripts and tests name them from here.
__all__ = ["EXIT_CACHE", "EXIT_CODES", "EXIT_CONFIG", "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_NOT_FOUND", "EXIT_OK",
           "EXIT_PROBLEMS", "EXIT_USAGE", "build_parser", "main"]


# Commands that look at what a directory holds: an explicit --dir must exist.
_READS_A_CACHE = frozenset({"stats", "ls", "show", "explain", "clear", "prune", "verify"})
DEMO_CONFIGS = 54  # the CUDA tile configs the demo sweeps (_demo_kernels.CUDA_TILES)

# ---- argument types and input errors ------------------------------------------------------------


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


def _count_arg(least: int, most: int | None = None):
    """An argparse type: a whole number in least..most (a usage error, exit 2, otherwise)."""
    accepted = f"a whole number of {least} or more" if most is None else f"a whole number from {least} to {most}"

    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {accepted}") from None
        if number < least or (most is not None and number > most):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {accepted}")
        return number

    parse.__name__ = "count"  # argparse names the type in some messages
    return parse


def _input_errors() -> tuple[type[BaseException], ...]:
    from .._errors import LoweringError
    from .._errors import KernelSourceError

    return (KernelSourceError, LoweringError, ValueError, TypeError)


# ---- the commands whose work lives in their own module ----------------------------------------


def cmd_explain(args: argparse.Namespace, settings: Settings) -> int:
    """Why a lowering missed: the nearest stored entries and the key parts they differ in."""
    from ._explain import explain, render
    from ._kernel_files import load_module

    try:
        mod, target, kernel = load_module(args.module, args.target, kernel=args.kernel,
                                          lowered=args.lowered or None)
        cache = open_cache(settings)
        entry = cache.resolve(target)
    except _input_errors() as err:
        raise CommandError(str(err), EXIT_INPUT) from None
    supported = [m for m in (True, False) if (entry.build if m else entry.build_without_compile) is not None]
    wanted = {"compiled": [True], "source": [False], "both": [True, False]}[args.mode]
    modes = [m for m in wanted if m in supported]
    if not modes:
        raise CommandError(f"codegen {entry.name!r} has no {args.mode} mode", EXIT_INPUT)
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
        print(f"warmed {summary['tasks']} lowerings in {summary['seconds']:.1f} s with {summary['workers']} "
              f"workers: {summary['built']} built, {summary['hit']} already cached, {summary['failed']} failed")
    return EXIT_PROBLEMS if summary["failed"] else EXIT_OK


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    """Key determinism across fresh processes, the cache filesystem, the toolchain."""
    from ._doctor import doctor, render

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
    """Every setting: its variable, value, where the value came from, and its default."""
    rows = [_redacted(r) for r in describe_settings(directory=args.dir)]
    unknown = unknown_env_vars()
    if args.json:
        print_json({"settings": [dataclasses.asdict(r) for r in rows], "unknown_env_vars": unknown})
        return EXIT_OK
    table = [["VARIABLE", "VALUE", "FROM", "DEFAULT"]]
    for r in rows:
        table.append([r.variable, _show_value(r.field, r.value), r.origin, _show_value(r.field, r.default)])
    print("\n".join(fmt_table(table)))
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


# Settings parsed as durations ("14d"): shown the way they are written.
_DURATIONS = frozenset(field for field, parse, _doc in ENV_VARS.values() if parse is parse_age)


def _show_value(field: str, value: object) -> str:
    if value is None:
        return "(unset)"
    if field.endswith(("_limit", "_bytes")):
        return format_size(int(value))  # type: ignore[arg-type]
    if field in _DURATIONS:
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
    parser.add_argument("--version", action="version", version=f"codegen-cache {__version__}")
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
    p.add_argument("-v", "--verbose", action="store_true", help="also the counters per codegen and mode")
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
    p.add_argument("--build", action="store_true", help="explain codegen_cache.build(kernel, target) (its build "
                   "key and index) instead of one codegen lowering")
    p.add_argument("--limit", type=_count_arg(1), default=3, help="nearest entries to show (default 3)")
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
    p.add_argument("-j", "--workers", type=_count_arg(0), default=None, help="worker processes (default: one per CPU; "
                   "0: in this process)")
    p.add_argument("--mode", choices=("auto", "compiled", "source", "both"), default="auto",
                   help="auto (default): compiled where the codegen compiles, else source")
    p.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p = add("doctor", cmd_doctor, "check key determinism, the cache filesystem and the toolchain")
    p.add_argument("--processes", type=_count_arg(0), default=3, help="fresh processes for the determinism check "
                   "(default 3; 0 skips it)")
    p.add_argument("--kernels", help="also check the keys of this file's kernels (with --target)")
    p.add_argument("-t", "--target", action="append", help="targets for --kernels (repeatable)")
    p = add("demo", cmd_demo, "an autotuning-style sweep lowered cold, then warm: a table of times and hits")
    p.add_argument("--nvcc-configs", type=_count_arg(0, DEMO_CONFIGS), default=None, metavar="N",
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
        if args.dir is not None and args.command in _READS_A_CACHE and not settings.directory.exists():
            # A mistyped --dir must not read as an empty cache ("removed 0 entries").
            raise ConfigError("--dir", args.dir, "an existing cache directory (this path does not exist; "
                              "warm, demo or a lowering create one)")
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
    from .._storage._disk import STORAGE_ERRORS

    return STORAGE_ERRORS


