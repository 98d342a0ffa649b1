"""benchmarks/run.py runs end to end (every section once, tiny counts) and writes its outputs.

The benchmarks themselves are not part of the test run; this only checks that the command
works, so that `python benchmarks/run.py --quick` does not rot between releases.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_run_smoke_writes_table_json_and_plot(tmp_path):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    done = subprocess.run(
        [sys.executable, str(RUN), "--smoke", "--json", str(out_json), "--plot", str(out_png),
         "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=280,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for title in ("== 1. hit vs floor vs cold", "== 5. miss overhead", "== 2. scaling", "== 2b. key cost",
                  "== 3. contention", "== 4. autotuning sweep", "== 6. alternatives",
                  "== 8. a fresh process's first disk hit", "== goals =="):
        assert title in done.stdout, title
    results = json.loads(out_json.read_text())
    rows = results["hits"]["rows"]
    assert {r["codegen"] for r in rows} == {"llvm", "c", "cuda-src"}
    for row in rows:
        assert row["miss_tiers"] == ["codegen"] and row["hit_tiers"]["disk"] == "disk"
        assert {"hash", "floor", "floor_ours", "disk", "memory", "files", "bare", "miss"} <= set(row["t"])
    # Hits are measured on the form a later run finds: llvm entries linked into shared libraries.
    assert {r["stored_form"] for r in rows if r["codegen"] == "llvm"} == {"llvm-so"}
    budgets = [g for g in results["goals"] if g["what"].startswith("miss overhead <= max(10%, 0.3ms)")]
    assert budgets and all(g["goal"] >= 0.3e-3 for g in budgets)
    assert [r["procs"] for r in results["contention"]["runs"]] == [1, 2]
    assert all(r["builds"] == results["contention"]["n_keys"] for r in results["contention"]["runs"])
    assert all(s["codegen_calls"] == 0 for s in results["sweep"]["warm"]["sweeps"].values())
    assert results["goals"] and {g["status"] for g in results["goals"]} <= {"PASS", "FAIL", "N/A"}
    # The drift checks of the kernel hits: both figures are goals of the run.
    whats = [g["what"] for g in results["goals"]]
    assert any(w.startswith("fresh process, first disk hit of a kernel <= 1.3x floor") for w in whats)
    assert "memory hit <= hash + 10us: vadd / llvm" in whats
    assert results["fresh_hit"]["tiers"] == ["disk"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out_png.stat().st_size < 400_000


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_checked_load_benchmark_runs(tmp_path):
    script = RUN.with_name("bench_checked_load.py")
    done = subprocess.run([sys.executable, str(script), "--rounds", "3"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("vadd", "matmul"))]
    assert [row[0] for row in rows] == ["vadd", "matmul"] and all(len(row) == 10 for row in rows), done.stdout


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_private_internals_benchmark_prints_every_pair():
    script = RUN.with_name("bench_private.py")
    done = subprocess.run([sys.executable, str(script), "--rounds", "2"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    firsts = [line.split()[0] for line in done.stdout.splitlines()[:-1]]
    assert firsts == ["env", "row", "1", "convert", "target"], done.stdout


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_cleanup_benchmark_times_each_fast_path_against_its_plain_form():
    script = RUN.with_name("bench_cleanup.py")
    done = subprocess.run([sys.executable, str(script), "--rounds", "2", "--compile-rounds", "0"], capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "source    as is" in done.stdout and "environ plain" in done.stdout, done.stdout


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_libraries_benchmark_prints_every_group():
    script = RUN.with_name("bench_libraries.py")
    done = subprocess.run([sys.executable, str(script), "--rounds", "3"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    groups = [line.split(",")[0].split(":")[0] for line in done.stdout.splitlines() if not line.startswith(" ")]
    assert groups[:3] == ["build lock of a new key", "staging a 4 KiB entry", "staging a 256 KiB entry"], done.stdout
    assert "an llvm entry on the caller's path" in groups, done.stdout
