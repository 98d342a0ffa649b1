"""`python -m benchmarks all --quick` runs every suite end to end and writes its JSON, page and plot.

The benchmarks themselves are not part of the test run; this checks that the command works, so
that `python -m benchmarks all --write-docs` does not rot between releases.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROW_KEYS = {"name", "median", "unit", "floor", "ratio", "goal", "ok", "note"}


@pytest.mark.timeout(1200)
@pytest.mark.slow
def test_the_quick_run_of_every_suite_writes_results_page_and_plot(tmp_path):
    out_json = tmp_path / "results.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "all", "--quick", "--json", str(out_json),
                           "--write-docs", "--docs-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1150)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = json.loads(out_json.read_text())
    suites = results["suites"]
    assert {"build", "hits", "compile", "models", "fleet", "tilelang", "startup", "tuning"} <= set(suites)
    for name, suite in suites.items():
        assert suite["error"] is None and suite["rows"], name
        assert all(set(r) == ROW_KEYS for r in suite["rows"]), name
        assert {r["ok"] for r in suite["rows"]} <= {True, False, None}, name
    names = [r["name"] for r in suites["hits"]["rows"]]
    # The drift checks of the kernel hits and the warm models are rows with goals.
    assert "memory hit: vadd / llvm" in names
    assert "fresh process, first disk hit of a kernel (cpu): vadd / llvm" in names
    assert any(r["name"].startswith("warm, CODEGEN_CACHE_ENABLE=1: llvm") and r["goal"] for r in suites["models"]["rows"])
    assert all(r["ok"] for r in suites["tuning"]["rows"] if r["name"].startswith("warm sweep"))
    page = (tmp_path / "benchmarks.md").read_text()
    assert len(page.splitlines()) <= 300
    for name in suites:
        assert f"\n## {name}\n" in page
    assert results["machine"]["commit"] in page
    png = (tmp_path / "benchmarks.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 400_000
