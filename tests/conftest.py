"""Shared fixtures: a fresh cache per test, kernels, spawned subprocess helpers."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import codegen_cache as cc  # noqa: E402
from codegen_cache import _compat  # noqa: E402
from s3_server import s3_env, s3_server  # noqa: E402, F401 - fixtures for the S3 tier (tests/s3_server.py)

# The suite's kernels are written for apache-tvm 0.27 (T.sblock, s_tir=True). On the TVM that
# tilelang bundles, only the tests written for both TVMs run (and tests/tilelang/).
ON_TILELANG_TVM = _compat.DISTRIBUTION == "tilelang"
_ON_BOTH_TVMS = {"test_compat.py", "test_layers.py"}
if ON_TILELANG_TVM:
    collect_ignore = [p.name for p in Path(__file__).parent.glob("test_*.py") if p.name not in _ON_BOTH_TVMS]
    kernels = None
else:
    import kernels  # noqa: E402

CUDA_TARGET = {"kind": "cuda", "arch": "sm_90"}
HAS_NVCC = shutil.which("nvcc") is not None


def pytest_addoption(parser):
    parser.addoption("--stress", action="store_true", default=False, help="run the long stress and fault tests")
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (fresh interpreters that import TVM; CI runs them; "
                          "--stress does too)")


def pytest_configure(config):
    # Tests set the settings they test: a developer's or CI's own CODEGEN_CACHE_* variables (a
    # VERIFY, a REMOTE, a name the library would warn about) must not leak into them.
    for name in [n for n in os.environ if n.startswith("CODEGEN_CACHE_") and n != "CODEGEN_CACHE_DIR"]:
        del os.environ[name]
    # Every entry stored, as the tests of storage, durability and the tiers expect: whether a tier
    # pays for a codegen depends on measured times, so tests/test_budget.py turns it on where it tests it.
    os.environ["CODEGEN_CACHE_MIN_CODEGEN_TIME"] = "0"
    # The default cache must never be the user's real one during tests.
    os.environ.setdefault("CODEGEN_CACHE_DIR", str(Path(config.rootpath) / ".pytest_cache" / "codegen-cache-default"))


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--stress"):
        skip = pytest.mark.skip(reason="stress test: run with --stress")
        for item in items:
            if "stress" in item.keywords:
                item.add_marker(skip)
    if not _runs_slow_tests(config):
        slow = [item for item in items if "slow" in item.keywords]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if "slow" not in item.keywords]
            config.stash[_SLOW_LEFT_OUT] = len(slow)


# ---- the slow tier -----------------------------------------------------------------------------
# A test that starts a fresh interpreter importing TVM (seconds each: a subprocess, spawned pool
# workers, MetaSchedule's popen workers) is marked slow and left out of the default run, which
# must stay within minutes; `--slow` runs them too (CI does). A small smoke set of such tests,
# marked smoke, stays in the default run, so that each kind of behaviour (the start-up hook,
# warm = cold, a fork/pool lifecycle, the upgrader, a CLI exit code, a doc block, MetaSchedule's
# builder workers) is seen there. The summary names unmarked tests that started interpreters
# through subprocess and took seconds.

_SLOW_LEFT_OUT = pytest.StashKey[int]()
# A test taking longer than this that started an interpreter is reported when it is in neither tier.
_FRESH_TVM_SECONDS = 2.0


def _runs_slow_tests(config) -> bool:
    """--slow or --stress (the longest run), a -m expression that names the marker, or a test named
    on the command line."""
    return (config.getoption("--slow") or config.getoption("--stress") or "slow" in (config.option.markexpr or "")
            or any("::" in arg for arg in config.args))


# This interpreter and its environment's scripts, as started: a test may replace sys.executable.
_THIS_PYTHON, _THIS_BIN = os.path.realpath(sys.executable), os.path.dirname(os.path.abspath(sys.executable))


def _is_python(argv0: str) -> bool:
    """Whether a command starts a Python interpreter (this one, another python*, or a script of this
    environment such as codegen-cache)."""
    path = shutil.which(argv0) or argv0
    real = os.path.realpath(path)
    if real == _THIS_PYTHON or re.fullmatch(r"python[\d.]*", os.path.basename(real)):
        return True
    if os.path.dirname(os.path.abspath(path)) != _THIS_BIN:
        return False
    try:
        with open(path, "rb") as f:
            return b"python" in f.readline(200)
    except OSError:
        return False


_STARTED = pytest.StashKey[dict]()  # nodeid -> Python interpreters it started (unmarked tests only)
_CURRENT = pytest.StashKey[dict]()


def pytest_sessionstart(session):
    started = session.config.stash[_STARTED] = {}
    current = session.config.stash[_CURRENT] = {"nodeid": None}

    def hook(event, args):
        # subprocess.Popen is audited; multiprocessing's spawn and forkserver start no test's interpreter
        # here (the suite's pools fork). The llvm upgrader and the clean-state helper are the
        # package's own helpers, started by whichever test stored an llvm entry or took the first
        # whole-compile key: not counted.
        if event == "subprocess.Popen" and current["nodeid"] is not None:
            executable, argv = args[0], args[1]
            argv = argv.split() if isinstance(argv, (str, bytes)) else [os.fsdecode(a) for a in argv or []]
            if executable is None:
                executable = argv[0] if argv else ""
            if any("codegen_cache._cache._upgrade" in arg or "codegen_cache._build._baseline" in arg for arg in argv):
                return
            if "-S" in argv[1:3]:  # no site-packages: it cannot import TVM
                return
            if _is_python(os.fsdecode(executable)):
                started[current["nodeid"]] = started.get(current["nodeid"], 0) + 1

    sys.addaudithook(hook)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    current = item.config.stash[_CURRENT]
    if not {"slow", "smoke"} & set(item.keywords):
        current["nodeid"] = item.nodeid
    try:
        return (yield)
    finally:
        current["nodeid"] = None


def pytest_terminal_summary(terminalreporter, config):
    left_out = config.stash.get(_SLOW_LEFT_OUT, 0)
    if left_out:
        terminalreporter.write_line(f"{left_out} tests marked slow (fresh interpreters importing TVM) were not run: "
                                    "add --slow to run them (CI does)")
    started = config.stash.get(_STARTED, {})
    # Starting an interpreter that does not import TVM is cheap (the CLI's commands that need no TVM).
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
    unmarked = sorted(nodeid for nodeid in started if seconds.get(nodeid, 0.0) > _FRESH_TVM_SECONDS)
    if unmarked:
        terminalreporter.write_sep("-", "unmarked tests that started Python interpreters and took seconds")
        terminalreporter.write_line("mark each @pytest.mark.slow where they import TVM (or smoke, for one per behaviour):")
        for nodeid in unmarked:
            terminalreporter.write_line(f"  {nodeid} ({started[nodeid]})")


@pytest.fixture(autouse=True)
def _switch_left_off():
    """Every test ends with codegen_cache's switch off (a test that turned it on and failed must not
    route the next tests, or leave CODEGEN_CACHE_ENABLE for their child processes)."""
    yield
    if cc.is_enabled():
        cc.disable()


def counting_codegen(name="llvm", kind="llvm"):
    """A DeviceCodegen wrapping `target.build.<kind>` that records each call; (codegen, calls)."""
    calls = []
    inner = cc.global_func_device_codegen(f"target.build.{kind}")

    def build(mod, target):
        calls.append(mod)
        return inner(mod, target)

    return cc.DeviceCodegen(name, build=build, build_without_compile=build), calls


def run_binary(module, func="vadd"):
    """Run a 1024-element binary kernel (`func`) on arange inputs; the output as numpy."""
    import numpy as np
    import tvm

    a = np.arange(1024, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(1024, "float32"))
    module[func](tvm.runtime.tensor(a), tvm.runtime.tensor(a), out)
    return out.numpy()


@pytest.fixture
def cache(tmp_path):
    """A CodegenCache in a fresh directory, writing synchronously."""
    c = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    yield c
    c.close()


@pytest.fixture(scope="session")
def llvm_vadd():
    """(device module, target) of a vector add for llvm."""
    return cc.prepare_for_codegen(kernels.vadd, "llvm")


@pytest.fixture(scope="session")
def llvm_vadds():
    """(device module, target) of eight vector adds for llvm (kernels.vadds): an entry in a value file."""
    return cc.prepare_for_codegen(kernels.vadds(), "llvm")


@pytest.fixture(scope="session")
def cuda_vadd():
    """(device module, target) of a vector add for CUDA sm_90."""
    return cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)


@pytest.fixture
def enabled(tmp_path):
    """enable() with a cache of its own (synchronous writes); undone after the test."""
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    cc.enable(cache, children=False)
    yield cache
    cc.disable()
    cache.close()
