"""The benchmarks of tvm-codegen-cache: one command, named suites, one JSON of results.

    python -m benchmarks SUITE... | all [--rounds N] [--quick] [--json PATH] [--write-docs]
    python -m benchmarks all --write-docs --from-json PATH    # the docs of an earlier run

A suite is a module `benchmarks/suite_<name>.py` with `DESCRIPTION = "..."` and
`run(rounds: int) -> list[dict]`, whose rows have the keys name, median, unit, floor, ratio,
goal, ok, note (timing.row makes one); `ROUNDS` (optional) is its default round count. Every
`suite_*.py` here is found by its file name. `--quick` runs each suite with 2 rounds and its
smallest sizes (the smoke test's mode); `--write-docs` writes docs/benchmarks.md,
docs/benchmarks.png and README.md's table of headline figures from the results of this run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

ROW_KEYS = ("name", "median", "unit", "floor", "ratio", "goal", "ok", "note")
QUICK_ROUNDS = 2
DEFAULT_ROUNDS = 5
DEFAULT_JSON = REPO / "benchmarks" / "results.json"


def suites() -> dict[str, Any]:
    """Every suite module here, by name (`suite_hits.py` -> "hits"), in file-name order."""
    found = {}
    for path in sorted(HERE.glob("suite_*.py")):
        name = path.stem.removeprefix("suite_")
        found[name] = importlib.import_module(path.stem)
    return found


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict[str, Any]:
    """What the figures were measured on, at which commit, under which load."""
    import diskcache
    import tvm
    import tvm_ffi

    cpu = "unknown"
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    except OSError:
        pass
    commit = _git("rev-parse", "--short", "HEAD")
    # Only what the figures depend on: the package and the benchmarks (not docs being edited).
    if _git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks"):
        commit += " (with uncommitted changes)"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit, "nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "platform": platform.platform(), "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__,
            "diskcache": diskcache.__version__, "load_start": os.getloadavg()[0]}


def check_rows(suite: str, rows: list[dict]) -> list[dict]:
    """The rows a suite returned, with exactly the keys of the interface (ValueError otherwise)."""
    for r in rows:
        if set(r) != set(ROW_KEYS):
            raise ValueError(f"suite {suite!r} returned a row with keys {sorted(r)}; expected {list(ROW_KEYS)}")
    return rows


def _status(ok: bool | None) -> str:
    return "-" if ok is None else "PASS" if ok else "FAIL"


def _fmt(value: float | None, unit: str) -> str:
    from timing import fmt_time

    if value is None or value != value:
        return "-"
    if unit == "s":
        return fmt_time(value)
    return f"{value:.3g} {unit}".strip()


def print_rows(name: str, result: dict) -> None:
    """One suite's rows as a text table."""
    print(f"== {name} ({result['rounds']} rounds, {result['seconds']:.0f} s, load {result['load_start']:.1f} -> "
          f"{result['load_end']:.1f}) ==")
    if result.get("error"):
        print(f"  ERROR: {result['error']}")
    for r in result["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3g}x"
        print(f"  {_status(r['ok']):4}  {r['name']}: {_fmt(r['median'], r['unit'])}  floor {_fmt(r['floor'], r['unit'])}"
              f"  ratio {ratio}  goal {r['goal'] or '-'}" + (f"  ({r['note']})" if r["note"] else ""))


def run_suites(names: list[str], rounds: int | None, quick: bool, log=print,
               json_path: Path | None = None) -> dict[str, Any]:
    """Run the named suites in turn; the results dict (what --json writes, after each suite where given)."""
    from timing import compile_bytecode

    compile_bytecode()
    found = suites()
    results: dict[str, Any] = {"machine": machine(), "quick": quick, "suites": {}}
    start = time.perf_counter()
    for name in names:
        module = found[name]
        n = QUICK_ROUNDS if quick else rounds or getattr(module, "ROUNDS", DEFAULT_ROUNDS)
        log(f"-- {name} ({n} rounds)")
        entry: dict[str, Any] = {"description": module.DESCRIPTION, "rounds": n, "load_start": os.getloadavg()[0],
                                 "rows": [], "error": None}
        t0 = time.perf_counter()
        # Suites that use tests/ helpers may have imported tests/kernels.py as `kernels`; the next
        # suite's `import kernels` (in forked workers too) is this directory's.
        if str(HERE) in sys.path:
            sys.path.remove(str(HERE))
        sys.path.insert(0, str(HERE))
        if getattr(sys.modules.get("kernels"), "__file__", None) != str(HERE / "kernels.py"):
            sys.modules.pop("kernels", None)
        try:
            entry["rows"] = check_rows(name, module.run(n))
        # A suite that cannot run here (a missing tool, a child that failed) is reported, and the
        # others still run.
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError, ImportError) as err:
            entry["error"] = f"{type(err).__name__}: {str(err)[-1500:]}"
        entry["seconds"] = time.perf_counter() - t0
        entry["load_end"] = os.getloadavg()[0]
        results["suites"][name] = entry
        if json_path is not None:  # after each suite: a run cut short keeps what it measured
            json_path.write_text(json.dumps(results, indent=1))
        print_rows(name, entry)
    results["machine"]["load_end"] = os.getloadavg()[0]
    results["seconds"] = time.perf_counter() - start
    return results


def main(argv: list[str] | None = None) -> int:
    """Command line: run the suites, print their rows, write the JSON (and the docs page)."""
    available = list(suites())
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("suites", nargs="+", metavar="SUITE", choices=[*available, "all"],
                        help=f"one or more of: {', '.join(available)}, or all")
    parser.add_argument("--rounds", type=int, help="rounds of every suite (default: each suite's own)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds and the smallest sizes: a smoke run")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where the results go (default {DEFAULT_JSON})")
    parser.add_argument("--write-docs", action="store_true",
                        help="write docs/benchmarks.md, docs/benchmarks.png and README.md's headline figures")
    parser.add_argument("--from-json", type=Path, metavar="PATH",
                        help="with --write-docs: write them from the results of an earlier run instead of running")
    parser.add_argument("--docs-dir", type=Path, default=REPO / "docs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.from_json:
        if not args.write_docs:
            parser.error("--from-json writes the docs of an earlier run: give --write-docs too")
        results = json.loads(args.from_json.read_text())
    else:
        names = available if "all" in args.suites else list(dict.fromkeys(args.suites))
        results = run_suites(names, args.rounds, args.quick, json_path=args.json)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))
        print(f"total {results['seconds']:.0f} s; results in {args.json}")
    if args.write_docs:
        from report import write_docs

        page = write_docs(results, args.docs_dir)
        print(f"wrote {page} and its plot")
        if args.docs_dir.resolve() == (REPO / "docs").resolve():
            from report import write_readme

            if write_readme(results, REPO / "README.md"):
                print("wrote README.md's headline figures")
    return 1 if any(s["error"] for s in results["suites"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
