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
    if {export!r}:
        module.export_library({lib!r})
        loaded = tvm.runtime.load_module({lib!r})
        out["ok"] = bool((run_binary(loaded) == 2 * np.arange(1024, dtype="float32")).all())
    cc.get_cache().flush()
    print(json.dumps(out))
""")


def _run(tmp_path, run: int, *, export: bool = True, env_extra: dict[str, str] | None = None) -> dict:
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "cache"), **(env_extra or {})}
    env.pop("CODEGEN_CACHE_DISABLE", None)
    script = _SCRIPT.format(tests=os.path.dirname(kernels.__file__), lib=str(tmp_path / f"export{run}.so"),
                            export=export)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=250)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_export_library_after_a_disk_hit_in_a_fresh_process(tmp_path):
    # cold; warm (the entry as stored); warm again (after the shared library upgrade)
    results = [_run(tmp_path, run) for run in range(3)]
    assert [r["tier"] for r in results] == ["codegen", "disk", "disk"], results
    assert all(r["ok"] for r in results), results
    # A hit is the cached module kind (the stored shared library, or the LLVM IR before its upgrade).
    assert {r["class"] for r in results[1:]} <= {"CachedLibraryModule", "CachedIRModule"}, results


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_export_library_of_an_entry_still_in_llvm_ir(tmp_path):
    """No compiler when it was stored: the entry stays LLVM IR; its hit exports and runs too."""
    stored = _run(tmp_path, 0, export=False, env_extra={"CC": "/bin/false", "CXX": "/bin/false"})
    hit = _run(tmp_path, 1)
    assert (stored["tier"], hit["tier"], hit["class"], hit["ok"]) == ("codegen", "disk", "CachedIRModule", True)
