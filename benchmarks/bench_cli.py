"""Wall time of the codegen-cache commands that only read or tidy a cache directory, each run as
the shell runs it (a fresh interpreter), and whether it imported TVM.

    python benchmarks/bench_cli.py --reps 7                       # this checkout
    python benchmarks/bench_cli.py --reps 7 --compare /tmp/old/src  # and another src/ tree, interleaved

Every run is `python -c "from codegen_cache._cli import main; main(argv)"` with the tree's src/
first on sys.path, against one cache directory (a C source entry, made here; --dir to use
another). Runs of the two trees alternate, so a slow spell of a shared machine hits both alike;
medians are printed, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (["--version"], ["config"], ["stats"], ["ls"], ["show", "KEY"], ["prune", "--older-than", "30d"],
            ["clear", "--failures"])

_RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from codegen_cache._cli import main
code = main(json.loads(sys.argv[2]))
print(json.dumps({"code": code, "tvm": "tvm" in sys.modules}), file=sys.stderr)
"""


def _fill(directory: Path) -> str:
    """A cache directory with one C source entry; its key."""
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    import kernels

    import codegen_cache as cc

    cache = cc.CodegenCache(directory, write_behind=False)
    _module, outcome = cache.lower_with_outcome(*cc.prepare_for_codegen(kernels.vmul, "c"), compile_device=False)
    cache.close()
    return outcome.key


def _once(src: str, argv: list[str]) -> tuple[float, bool]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _RUN, src, json.dumps(argv)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CODEGEN_CACHE_ENABLE": ""})
    seconds = time.perf_counter() - start
    result = json.loads(done.stderr.strip().splitlines()[-1])
    if result["code"] != 0:
        raise SystemExit(f"{argv} exited {result['code']}: {done.stdout[-500:]}")
    return seconds, result["tvm"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--compare", help="another src/ tree, timed interleaved with this one")
    parser.add_argument("--dir", help="cache directory to run against (default: a fresh one with one entry)")
    parser.add_argument("--json", help="write the runs here")
    args = parser.parse_args()
    trees = {"this": str(ROOT / "src")}
    if args.compare:
        trees = {"other": args.compare, **trees}
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(args.dir) if args.dir else Path(scratch) / "cache"
        key = _fill(directory) if not args.dir else ""
        runs: dict[str, dict[str, list[float]]] = {}
        imports: dict[str, dict[str, bool]] = {}
        for command in COMMANDS:
            if "KEY" in command and not key:
                continue
            argv = ["--dir", str(directory), *[a.replace("KEY", key[:12]) for a in command]]
            label = " ".join(command).replace("KEY", "<key>")
            runs[label] = {name: [] for name in trees}
            imports[label] = {}
            for rep in range(args.reps):
                order = list(trees) if rep % 2 == 0 else list(reversed(trees))
                for name in order:
                    seconds, tvm = _once(trees[name], argv)
                    runs[label][name].append(seconds)
                    imports[label][name] = tvm
            medians = {name: statistics.median(times) for name, times in runs[label].items()}
            cells = "  ".join(f"{name} {medians[name]:6.2f} s (TVM {'imported' if imports[label][name] else 'not imported'})"
                              for name in trees)
            ratio = f"  this/other {medians['this'] / medians['other']:.2f}" if "other" in trees else ""
            print(f"{label:<26} {cells}{ratio}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "tvm_imported": imports,
                                               "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
