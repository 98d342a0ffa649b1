"""Where a GPU is present: kernels served by the cache (a fresh process's disk hit) run and match numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import NO_TILELANG, NO_TILELANG_MODULE

pytest.importorskip(NO_TILELANG_MODULE, reason=NO_TILELANG)
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")]

_CHILD = r"""
import json, sys
import numpy as np
import torch
import tilelang
sys.path.insert(0, sys.argv[1])
import tl_kernels
import codegen_cache as cc, codegen_cache.tilelang as cct
cct.enable()
major, minor = torch.cuda.get_device_capability()
target = {"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major == 9 else "")}  # sm_90a: wgmma/setmaxnreg
out = {}
with cc.record_outcomes() as outcomes:
    vadd = tilelang.compile(tl_kernels.vadd(), target=target)
    gemm = tilelang.compile(tl_kernels.gemm(), target=target)
a = torch.arange(1024, dtype=torch.float32, device="cuda")
b = torch.full((1024,), 0.5, dtype=torch.float32, device="cuda")
c = torch.empty(1024, dtype=torch.float32, device="cuda")
vadd(a, b, c)
torch.cuda.synchronize()
out["vadd_ok"] = bool(np.allclose(c.cpu().numpy(), a.cpu().numpy() + 0.5))
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 256)).astype(np.float16)
y = rng.standard_normal((256, 256)).astype(np.float16)
z = torch.empty(256, 256, dtype=torch.float16, device="cuda")
gemm(torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda(), z)
torch.cuda.synchronize()
want = x.astype(np.float32) @ y.astype(np.float32)
out["gemm_max_err"] = float(np.abs(z.cpu().numpy().astype(np.float32) - want).max())
out["tiers"] = [(o.codegen, o.tier) for o in outcomes]
print(json.dumps(out))
"""


def _run(tmp_path: Path) -> dict:
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "cc"), "TILELANG_CACHE_DIR": str(tmp_path / "tl")}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).parent)], env=env, capture_output=True,
                          text=True, timeout=800, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_kernels_from_a_disk_hit_run_on_the_gpu_and_match_numpy(tmp_path):
    cold = _run(tmp_path)
    hit = _run(tmp_path)  # a fresh process: both kernels come from the cache's frontend entries
    assert [t[1] for t in hit["tiers"] if t[0] == "tilelang.compile"] == ["disk", "disk"]
    for run in (cold, hit):
        assert run["vadd_ok"]
        assert run["gemm_max_err"] < 0.5  # fp16 output of 256-term fp32 sums
