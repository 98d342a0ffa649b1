"""What CODEGEN_CACHE_ENABLE=1 costs a process at start-up: fresh interpreters, alternating, medians.

    python benchmarks/bench_startup.py --rounds 21

Pairs, each run in turn within a round (the order flips every round); for each process its
wall time from start to exit and its CPU time (user + system, from wait4: less disturbed by
other jobs on a shared machine than the wall time). The children write .pyc files as a user's
processes do (PYTHONDONTWRITEBYTECODE is dropped):

- `python -c pass` with the variable unset / set to 1;
- `python -c "import json"` with the variable unset / set to 1;
- `python -c "import tvm"` with the variable set to 1 (the switch turns on at `import tvm`) /
  `python -c "import tvm; import codegen_cache"` with the variable unset.

Beside the pairs: enable_from_environment() itself, in a process that has imported tvm and
codegen_cache (CPU time, in-process): what the start-up hook adds to `import tvm` besides
importing the package.

The machine is shared: each pair's figure is the median of its per-round differences and
ratios, measured side by side, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

PAIRS = {
    "python -c pass": (("pass", "1"), ("pass", None)),
    'python -c "import json"': (("import json", "1"), ("import json", None)),
    "import tvm (variable set) vs import tvm; import codegen_cache": (
        ("import tvm", "1"), ("import tvm; import codegen_cache", None)),
}


def _run(code: str, variable: str | None, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one fresh `python -c code`."""
    env = dict(env)
    if variable is not None:
        env["CODEGEN_CACHE_ENABLE"] = variable
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"python -c {code!r} exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


ENABLE_CHILD = """
import os, sys, time
import tvm, codegen_cache
from codegen_cache._switch import enable_from_environment
os.environ["CODEGEN_CACHE_ENABLE"] = "1"
n = len(sys.modules)
t0 = time.process_time()
assert enable_from_environment()
print(time.process_time() - t0, len(sys.modules) - n)
"""


def bench_enable(rounds: int, env: dict[str, str]) -> dict:
    """CPU time of enable_from_environment() after `import tvm, codegen_cache`, and the modules it imports."""
    found = [subprocess.run([sys.executable, "-c", ENABLE_CHILD], env=env, check=True, capture_output=True,
                            text=True).stdout.split() for _ in range(rounds)]
    return {"median_cpu_ms": 1e3 * statistics.median(float(f[0]) for f in found),
            "modules_imported": max(int(f[1]) for f in found)}


def bench(rounds: int, pairs: list[str]) -> dict:
    """Alternating fresh-process runs of each pair; medians, per-round differences and ratios."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        # As a user's processes run: .pyc files are written (pip writes them for a regular install).
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("CODEGEN_CACHE_") and k != "PYTHONDONTWRITEBYTECODE"}
        env["CODEGEN_CACHE_DIR"] = str(Path(tmp) / "cache")
        out = {"rounds": rounds, "load_before": os.getloadavg(), "python": sys.version.split()[0],
               "hook_installed": (Path(sysconfig.get_paths()["purelib"]) / "codegen_cache_enable.pth").exists(),
               "pairs": {}}
        for name in pairs:
            switched, plain = PAIRS[name]
            _run(*switched, env), _run(*plain, env)  # warm the page cache and the .pyc files
            samples: dict[str, list[tuple[float, float]]] = {"switched": [], "plain": []}
            for r in range(rounds):
                order = (("switched", switched), ("plain", plain)) if r % 2 == 0 else \
                    (("plain", plain), ("switched", switched))
                for label, (code, variable) in order:
                    samples[label].append(_run(code, variable, env))
            found = {}
            for i, measure in enumerate(("wall", "cpu")):
                a = [x[i] for x in samples["switched"]]
                b = [x[i] for x in samples["plain"]]
                found[measure] = {
                    "median_switched_ms": 1e3 * statistics.median(a),
                    "median_plain_ms": 1e3 * statistics.median(b),
                    "median_difference_ms": 1e3 * statistics.median(x - y for x, y in zip(a, b)),
                    "median_ratio": statistics.median(x / y for x, y in zip(a, b)),
                }
            out["pairs"][name] = {**found, "samples": samples}
        if any(name.startswith("import tvm") for name in pairs):
            out["enable"] = bench_enable(max(3, rounds // 3), env)
        out["load_after"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--pairs", nargs="*", choices=list(PAIRS), default=list(PAIRS))
    parser.add_argument("--json", action="store_true", help="print every sample as JSON")
    args = parser.parse_args(argv)
    result = bench(args.rounds, args.pairs)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.rounds} rounds, Python {result['python']}, start-up hook installed: {result['hook_installed']}, "
          f"load {result['load_before'][0]:.1f} -> {result['load_after'][0]:.1f}")
    for name, p in result["pairs"].items():
        for measure in ("wall", "cpu"):
            m = p[measure]
            print(f"{name} [{measure}]: {m['median_switched_ms']:.1f} ms vs {m['median_plain_ms']:.1f} ms; per round "
                  f"{m['median_difference_ms']:+.1f} ms, ratio {m['median_ratio']:.3f} (medians)")
    if "enable" in result:
        print(f"enable_from_environment() after import tvm, codegen_cache: {result['enable']['median_cpu_ms']:.2f} ms "
              f"CPU (median), {result['enable']['modules_imported']} modules imported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
