"""Shared fixtures: a fresh cache per test, kernels, spawned subprocess helpers."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import codegen_cache as cc  # noqa: E402
from codegen_cache import _compat  # noqa: E402

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
    if config.getoption("--stress"):
        return
    skip = pytest.mark.skip(reason="stress test: run with --stress")
    for item in items:
        if "stress" in item.keywords:
            item.add_marker(skip)


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
def cuda_vadd():
    """(device module, target) of a vector add for CUDA sm_90."""
    return cc.prepare_for_codegen(kernels.vadd_gpu, CUDA_TARGET)
