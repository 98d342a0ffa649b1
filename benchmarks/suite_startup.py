"""What CODEGEN_CACHE_ENABLE=1 and the package's import cost a process at start-up, in fresh interpreters.

Pairs, each side a fresh interpreter, one of each per round in a new order (timing.fresh_rounds);
each process's wall time from start to exit and its CPU time (user + system, from wait4: less
disturbed by other jobs on a shared machine than the wall time). The children write .pyc files
as a user's processes do:

- `python -c pass` with the variable set / unset;
- `python -c "import json"` with the variable set / unset;
- `import tvm` with the variable set (the switch turns on at `import tvm`) / `import tvm; import
  codegen_cache` with it unset.

Then, in fresh interpreters, `import tvm`, `import codegen_cache` and `enable()` each timed alone
(CPU time; the process is one thread there).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import child_env, fresh_rounds, paired, row, run_child

ROUNDS = 11
DESCRIPTION = (
    "What a process pays at start-up for `CODEGEN_CACHE_ENABLE=1` and for the package: fresh interpreters in pairs "
    "(the variable set / unset), CPU time (user + system, from `wait4`) and wall time of the whole process; then "
    "`import tvm`, `import codegen_cache` and `enable()` each timed alone. **Floor**: the same process without the "
    "variable (or without the package). **Goals**: a Python process that never imports TVM pays at most 5 ms of CPU "
    "for the variable; `import codegen_cache` after `import tvm` costs at most 2% of `import tvm`.")

PAIRS = {
    "python -c pass": ("pass", "pass"),
    'python -c "import json"': ("import json", "import json"),
    "import tvm": ("import tvm", "import tvm; import codegen_cache"),
}

IMPORT_CHILD = r"""
import json, sys, tempfile, time
clock = time.process_time  # the whole process is one thread here: TVM's import starts none that count
t0 = clock()
import tvm
tvm_seconds = clock() - t0
t0 = clock()
import codegen_cache
package_seconds = clock() - t0
t0 = clock()
codegen_cache.enable(codegen_cache.CodegenCache(tempfile.mkdtemp()), children=False)
print(json.dumps({"tvm": tvm_seconds, "package": package_seconds, "enable": clock() - t0}))
"""


def _process(code: str, env: dict[str, str]) -> dict[str, float]:
    """Wall and CPU time (user + system) of one fresh `python -c code`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"python -c {code!r} exited {os.waitstatus_to_exitcode(status)}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime}


def run(rounds: int) -> list[dict]:
    """Each pair's CPU and wall times, and the import shares, as rows."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        cache = str(Path(tmp) / "cache")
        on = child_env(CODEGEN_CACHE_ENABLE="1", CODEGEN_CACHE_DIR=cache)
        off = child_env(CODEGEN_CACHE_DIR=cache)
        for name, (switched, plain) in PAIRS.items():
            s = fresh_rounds({"on": lambda c=switched: _process(c, on), "off": lambda c=plain: _process(c, off)},
                             rounds, warmup=1)
            for clock in ("cpu", "wall"):
                a, b = [x[clock] for x in s["on"]], [x[clock] for x in s["off"]]
                ratio, noise = paired(a, b)
                diff = statistics.median(x - y for x, y in zip(a, b))
                goal = "<= floor + 5ms" if clock == "cpu" and not name.startswith("import tvm") else None
                rows.append(row(f"{name}, CODEGEN_CACHE_ENABLE=1 ({clock})", statistics.median(a),
                                floor=statistics.median(b), ratio=ratio, goal=goal,
                                ok=diff <= 5e-3 if goal else None,
                                note=f"per round {diff * 1e3:+.1f} ms; ratio noise +-{noise:.3f}"
                                     + ("; floor: import tvm; import codegen_cache" if name == "import tvm" else "")))
        found = [run_child(IMPORT_CHILD, [], off) for _ in range(max(3, rounds // 2))]
    med = {k: statistics.median(f[k] for f in found) for k in ("tvm", "package", "enable")}
    share = statistics.median(f["package"] / f["tvm"] for f in found)
    rows.append(row("import codegen_cache after import tvm (CPU)", med["package"], floor=med["tvm"], ratio=share,
                    goal="<= 2% of import tvm", ok=share <= 0.02, note=f"import tvm {med['tvm'] * 1e3:.0f} ms"))
    rows.append(row("enable() after import tvm, codegen_cache (CPU)", med["enable"], floor=med["tvm"],
                    note="imports the cache layer and the switch"))
    return rows
