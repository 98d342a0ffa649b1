"""export_library on a cache hit works as on a fresh build: the exported library loads and runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import kernels

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import numpy as np, tvm
    import codegen_cache as cc, kernels
    from conftest import run_binary

    out = {{}}
    with cc.record_outcomes() as seen:
        module = cc.build(kernels.vadd, "llvm")
    out["tier"] = seen[-1].tier
    out["class"] = type(module).__name__
    module.export_library({lib!r})
    loaded = tvm.runtime.load_module({lib!r})
    out["ok"] = bool((run_binary(loaded) == 2 * np.arange(1024, dtype="float32")).all())
    cc.get_cache().flush()
    print(json.dumps(out))
""")


@pytest.mark.timeout(300)
def test_export_library_after_a_disk_hit_in_a_fresh_process(tmp_path):
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("CODEGEN_CACHE_DISABLE", None)
    results = []
    for run in range(3):  # cold; warm (entry as stored); warm again (after the shared library upgrade)
        lib = tmp_path / f"export{run}.so"
        script = _SCRIPT.format(tests=os.path.dirname(kernels.__file__), lib=str(lib))
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=250)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [r["tier"] for r in results] == ["built", "disk", "disk"], results
    assert all(r["ok"] for r in results), results
    # A hit is the cached module kind (the stored shared library, or the LLVM IR before its upgrade).
    assert {r["class"] for r in results[1:]} <= {"CachedLibraryModule", "CachedIRModule"}, results
