"""codegen_cache.enable() with tilelang's TVM is codegen_cache.tilelang.enable(); CODEGEN_CACHE_ENABLE reaches it too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import NO_TILELANG, NO_TILELANG_MODULE

pytest.importorskip(NO_TILELANG_MODULE, reason=NO_TILELANG)

import tilelang  # noqa: E402,F401

import codegen_cache as cc  # noqa: E402
import codegen_cache.tilelang as cct  # noqa: E402

pytestmark = pytest.mark.timeout(600)
HERE = Path(__file__).parent


def test_enable_turns_on_tilelangs_switch_and_disable_turns_it_off():
    assert not cct.is_enabled()
    cc.enable(children=False)
    try:
        assert cc.is_enabled() and cct.is_enabled()
    finally:
        cc.disable()
    assert not cc.is_enabled() and not cct.is_enabled()


_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import tilelang
import tl_kernels
import codegen_cache as cc, codegen_cache.tilelang as cct
with cc.record_outcomes() as outcomes:
    kernel = tilelang.compile(tl_kernels.vadd(), target={"kind": "cuda", "arch": "sm_80"})
print(json.dumps({"enabled": cct.is_enabled(), "tiers": [(o.codegen, o.tier) for o in outcomes]}))
"""


@pytest.mark.slow
def test_the_variable_enables_a_process_that_imports_tilelang(tmp_path):
    env = {**os.environ, "CODEGEN_CACHE_ENABLE": "1", "CODEGEN_CACHE_DIR": str(tmp_path / "cache"),
           "TILELANG_CACHE_DIR": str(tmp_path / "tilelang-cache")}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _CHILD, str(HERE)], capture_output=True, text=True, env=env,
                              timeout=500, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["enabled"] and runs[1]["enabled"]
    assert any(tier == "disk" for _codegen, tier in runs[1]["tiers"]), runs[1]
