"""Run files of apache-tvm's own test suite with no cache, an empty cache and a warm one; compare.

    python tools/tvm_suite.py --tvm TVM_CHECKOUT [--workdir DIR] [--routing fixture|env] [FILE ...]

TVM_CHECKOUT is a checkout (or unpacked archive) of apache/tvm whose tests/python the installed
apache-tvm can run; nothing of it is copied here. FILEs are paths under it (default: DEFAULT_FILES:
the codegen, runtime-module and Relax VM build tests that run on a CPU machine). Each condition
runs pytest in fresh processes, with a JUnit report:

- none:  TVM alone;
- empty: TVM's builds routed through the cache, in a new cache directory;
- warm:  the same, in new processes over the directory the empty run filled.

Routing: `fixture` loads tests/routing.py's route() as a pytest plugin (tvm.tirx.build through
codegen_cache.build, relax.build reaching it); `env` sets CODEGEN_CACHE_ENABLE=1 (the package's
own switch, once it has one). It prints how many tests had the same outcome in every condition
and lists each test whose outcome changed. Not part of the test run: it takes tens of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = [
    "tests/python/codegen",
    "tests/python/runtime/test_runtime_module_export.py",
    "tests/python/runtime/test_runtime_module_load.py",
    "tests/python/runtime/test_runtime_module_property.py",
    "tests/python/runtime/test_executable.py",
    "tests/python/relax/test_vm_build.py",
    "tests/python/relax/test_vm_codegen_only.py",
    "tests/python/relax/test_vm_codegen_tir.py",
    "tests/python/relax/test_vm_execbuilder.py",
    "tests/python/relax/test_vm_builtin_lower.py",
]
CONDITIONS = ("none", "empty", "warm")
_PLUGIN = "cgc_tvm_suite_routing"


def _outcomes(report: Path) -> dict[str, str]:
    """test id -> passed / failed / error / skipped, from a JUnit report."""
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                state = {"failure": "failed"}.get(child.tag, child.tag)
                if child.tag != "skipped":
                    state += ": " + (child.get("message") or "").splitlines()[0][:160] if child.get("message") else ""
        found[name] = state
    return found


def _run(condition: str, args: argparse.Namespace, work: Path) -> dict[str, str]:
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(work / "cache")}
    for name in ("CODEGEN_CACHE_DISABLE", "CODEGEN_CACHE_ENABLE"):
        env.pop(name, None)
    plugin_args: list[str] = []
    if condition != "none":
        if args.routing == "env":
            env["CODEGEN_CACHE_ENABLE"] = "1"
        else:
            plugin_dir = work / "plugin"
            plugin_dir.mkdir(exist_ok=True)
            (plugin_dir / f"{_PLUGIN}.py").write_text(
                "import routing\n\n\ndef pytest_configure(config):\n    routing.route()\n")
            env["PYTHONPATH"] = os.pathsep.join([str(plugin_dir), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
            plugin_args = ["-p", _PLUGIN]
    report = work / f"{condition}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *plugin_args,
               f"--junitxml={report}", f"--timeout={args.timeout}", *args.files]
    print(f"[{condition}] {' '.join(command[3:])}", flush=True)
    with open(work / f"{condition}.log", "w") as log:
        subprocess.run(command, cwd=args.tvm, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if condition == "empty":  # entries written behind the run reach their stores; llvm ones are linked
        subprocess.run([sys.executable, "-c", "import codegen_cache as cc; cc.get_cache().flush(upgrades=True, "
                        "timeout=600)"], env=env, check=False)
    return _outcomes(report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tvm", required=True, type=Path, help="a checkout of apache/tvm (tests/python inside)")
    parser.add_argument("--workdir", type=Path, default=Path("tvm-suite-run"))
    parser.add_argument("--routing", choices=("fixture", "env"), default="fixture")
    parser.add_argument("--timeout", type=int, default=600, help="per-test timeout (pytest-timeout)")
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES)
    args = parser.parse_args(argv)
    if not (args.tvm / "tests" / "python").is_dir():
        parser.error(f"--tvm {args.tvm} has no tests/python: expected a checkout of apache/tvm")
    args.workdir.mkdir(parents=True, exist_ok=True)
    work = args.workdir.resolve()
    results = {condition: _run(condition, args, work) for condition in CONDITIONS}
    tests = sorted(set().union(*results.values()))
    # Compared by outcome (a failure's message may hold paths or addresses); listed with messages.
    changed = {t: {c: results[c].get(t, "absent") for c in CONDITIONS} for t in tests
               if len({results[c].get(t, "absent").split(":")[0] for c in CONDITIONS}) > 1}
    summary = {"tests": len(tests), "same": len(tests) - len(changed),
               "empty_changed": sum(1 for v in changed.values() if v["empty"].split(":")[0] != v["none"].split(":")[0]),
               "warm_changed": sum(1 for v in changed.values() if v["warm"].split(":")[0] != v["none"].split(":")[0]),
               "outcomes_none": dict(Counter(s.split(":")[0] for s in results["none"].values()))}
    (work / "comparison.json").write_text(json.dumps({"summary": summary, "changed": changed}, indent=1))
    print(json.dumps(summary, indent=1))
    for test, by_condition in changed.items():
        print(f"CHANGED {test}: " + "; ".join(f"{c}={s}" for c, s in by_condition.items()))
    return 0 if not changed else 1


if __name__ == "__main__":
    sys.exit(main())
