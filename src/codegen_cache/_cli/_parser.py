"""The argument parser of `codegen-cache`: commands, options, and argument types whose bad
values are usage errors (exit 2) naming what is accepted. _main runs the parsed command."""

from __future__ import annotations

import argparse

from .._config import FILE_ALIASES, FILE_SETTINGS, ConfigError, file_setting, parse_age, parse_size
from .._version import __version__
from ._commands import EXIT_CODES

__all__ = ["DEMO_CONFIGS", "READS_A_CACHE", "SHORT_OPTIONS", "build_parser", "expand_short_options"]

# Commands that look at what a directory holds: an explicit --dir must exist.
READS_A_CACHE = frozenset({"stats", "ls", "show", "explain", "clear", "prune", "verify"})
DEMO_CONFIGS = 54  # the CUDA tile configs the demo sweeps (_demo_kernels.CUDA_TILES)

# ---- argument types: bad values are usage errors --------------------------------------------


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


def _epilog() -> str:
    short = "ccache's short options:\n" + "\n".join(
        f"  {option:<3}  " + ("config --set max_size=SIZE (-M SIZE)" if option == "-M" else " ".join(command))
        for option, command in SHORT_OPTIONS.items())
    return short + "\n\nexit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


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

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_text, description=help_text, epilog=_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    def store_flags(p: argparse.ArgumentParser, failures: bool = True, tilelang: bool = True) -> None:
        p.add_argument("--compiled", action="store_true", help="the compiled store (compile_device=True)")
        p.add_argument("--source", action="store_true", help="the source-only store (compile_device=False)")
        if failures:
            p.add_argument("--failures", action="store_true", help="the failure cache (codegen errors)")
        if tilelang:
            p.add_argument("--tilelang", action="store_true", help="tilelang.compile results "
                           "(codegen_cache.tilelang's frontend entries)")

    p = add("stats", "entries and bytes per store, hits and misses per tier, errors, time saved")
    p.add_argument("--reset", action="store_true", help="zero the counters (entries stay)")
    p.add_argument("-v", "--verbose", action="store_true", help="also the counters per codegen and mode")
    p = add("ls", "list entries: codegen, target, mode, size, age, codegen time")
    store_flags(p)
    p.add_argument("--sort", choices=("age", "size", "codegen", "key"), default="age",
                   help="order (default: newest first; codegen: longest codegen time first)")
    p = add("show", "one entry in full, with its key parts")
    p.add_argument("key", metavar="KEY", help="the key or a unique prefix of it")
    p.add_argument("--code", action="store_true", help="also print the stored source (CUDA/C source)")
    p = add("explain", "why a lowering misses: the nearest entries and the key parts that differ")
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
    p.add_argument("--model", action="store_true", help="explain tvm.compile of the Relax model the .py FILE "
                   "leaves in `mod` (its model key; for a miss, the key parts that differ from the nearest entry "
                   "of the same model)")
    p.add_argument("--limit", type=_count_arg(1), default=3, help="nearest entries to show (default 3)")
    p = add("clear", "remove every entry (of the chosen stores; all by default)")
    store_flags(p, tilelang=False)
    p.add_argument("-n", "--dry-run", action="store_true", help="say what would be removed; remove nothing")
    p = add("prune", "remove old entries, or the least recently used until the stores fit a size")
    p.add_argument("--max-size", type=_size_arg, metavar="SIZE", help="e.g. 2G: remove the least recently used "
                   "entries until the stores together hold at most this")
    p.add_argument("--older-than", type=_age_arg, metavar="AGE", help="e.g. 30d: remove entries written "
                   "longer ago")
    store_flags(p, failures=False)
    p.add_argument("-n", "--dry-run", action="store_true", help="say what would be removed; remove nothing")
    p = add("verify", "check every entry's framing, checksum and key")
    p.add_argument("--fix", action="store_true", help="remove the bad entries")
    p = add("warm", "lower a file's kernels for targets in worker processes (progress bar)")
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
    p = add("doctor", "check key determinism, the cache filesystem and the toolchain")
    p.add_argument("--processes", type=_count_arg(0), default=3, help="fresh processes for the determinism check "
                   "(default 3; 0 skips it)")
    p.add_argument("--kernels", help="also check the keys of this file's kernels (with --target)")
    p.add_argument("-t", "--target", action="append", help="targets for --kernels (repeatable)")
    p = add("demo", "an autotuning-style sweep lowered cold, then warm: a table of times and hits")
    p.add_argument("--nvcc-configs", type=_count_arg(0, DEMO_CONFIGS), default=None, metavar="N",
                   help="how many of the 54 CUDA configs nvcc compiles (default 18; 0: none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p = add("config", "every setting: value, where it came from, default; --set keeps one in the directory")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", default=[], type=_assignment,
                   help="keep a setting in the directory's cache.conf (repeatable), e.g. max_size=5G; "
                   f"NAME is one of {', '.join((*FILE_SETTINGS, *FILE_ALIASES))}")
    p.add_argument("--unset", action="append", metavar="NAME", default=[],
                   help="remove a setting from the directory's cache.conf (repeatable)")
    return parser


# ccache's short options, each the command (and options) it stands for here: `codegen-cache -s`
# is `codegen-cache stats`. -M takes ccache's size (`-M 5G`, `-M5G`).
SHORT_OPTIONS = {"-s": ["stats"], "-z": ["stats", "--reset"], "-C": ["clear"], "-p": ["config"],
                 "-V": ["--version"], "-x": ["explain"], "-M": ["config", "--set"]}


def expand_short_options(argv: list[str]) -> list[str]:
    """argv with a ccache short option in the command's place replaced by the command it stands for."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--dir":
            i += 2
            continue
        if word.startswith("--dir=") or word == "--json":
            i += 1
            continue
        if word.startswith("-M") and word not in SHORT_OPTIONS:
            argv[i: i + 1] = ["-M", word[2:]]  # -M5G
            word = "-M"
        if word == "-M":
            if i + 1 >= len(argv):
                return argv  # argparse says -M needs its SIZE
            return [*argv[:i], "config", "--set", f"max_size={argv[i + 1]}", *argv[i + 2:]]
        if word in SHORT_OPTIONS:
            return [*argv[:i], *SHORT_OPTIONS[word], *argv[i + 1:]]
        return argv  # the command (or an option argparse will explain)
    return argv


def _assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected NAME=VALUE, e.g. max_size=5G")
    try:
        return file_setting(name, value)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
