"""A real Jupyter kernel (nbclient + ipykernel): cells re-run in fresh kernels, interrupted, shut down.

This is how notebook users meet the cache: each run of the notebook is a new kernel that is
shut down right after its last cell, and an interrupt is SIGINT to the kernel's process group
(the kernel, and any helper it started in that group).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

import codegen_cache as cc
from test_lifecycle import _codec

nbformat = pytest.importorskip("nbformat", reason="nbformat (with nbclient, ipykernel) runs the notebook tests")
nbclient = pytest.importorskip("nbclient", reason="nbclient (with ipykernel) runs the notebook tests")
pytest.importorskip("ipykernel", reason="ipykernel is the kernel the notebook tests start")

HERE = Path(__file__).parent

SETUP = """
    import sys, time
    sys.path.insert(0, {here!r})
    import codegen_cache as cc
    from workers import variant
    cache = cc.CodegenCache({directory!r})
"""

LOWER = """
    tiers = []
    for i in range({count}):
        _module, outcome = cache.lower_with_outcome(*variant(i), compile_device=True)
        tiers.append(outcome.tier)
    print("TIERS", ",".join(tiers))
"""


def _run(cells: list[str], *, directory: Path, count: int, last_cell_timeout: int = 120) -> list[str]:
    """Run the cells in a fresh kernel (shut down after the last cell); the printed lines.

    The last cell is interrupted (SIGINT to the kernel's process group) after `last_cell_timeout` s.
    """
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(textwrap.dedent(cell).format(
        here=str(HERE), directory=str(directory), count=count)) for cell in cells]
    last = notebook.cells[-1]
    client = nbclient.NotebookClient(notebook, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                                     timeout_func=lambda cell: last_cell_timeout if cell is last else 120,
                                     resources={"metadata": {"path": str(HERE)}})
    client.execute(env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])})
    lines = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            lines += output.get("text", "").splitlines()
            if output.get("output_type") == "error":
                lines.append(f"ERROR {output['ename']}")
    return lines


def _tiers(lines: list[str]) -> list[str]:
    found = [line.split(" ", 1)[1].split(",") for line in lines if line.startswith("TIERS ")]
    assert len(found) == 1, lines
    return found[0]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_notebook_run_twice_back_to_back_hits_every_kernel_the_second_time(tmp_path):
    directory = tmp_path / "cache"
    # The kernel is shut down right after the last cell returns: what a "Run all" then close does.
    assert _tiers(_run([SETUP, LOWER], directory=directory, count=4)) == ["codegen"] * 4
    assert _tiers(_run([SETUP, LOWER], directory=directory, count=4)) == ["disk"] * 4


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_an_interrupted_cell_after_its_lowerings_keeps_every_entry_and_the_upgrades_finish(tmp_path):
    directory = tmp_path / "cache"
    # A cell lowers; the next runs on until nbclient's cell timeout interrupts the kernel (SIGINT to
    # its process group) a second later, while the llvm entries are being linked in the background.
    lines = _run([SETUP, LOWER, "time.sleep(120)"], directory=directory, count=4, last_cell_timeout=1)
    assert _tiers(lines) == ["codegen"] * 4
    assert "ERROR KeyboardInterrupt" in lines, lines
    # A fresh kernel is served every entry from disk; the interrupted links were finished or redone.
    assert _tiers(_run([SETUP, LOWER], directory=directory, count=4)) == ["disk"] * 4
    assert cc.CodegenCache(directory).flush(upgrades=True, timeout=180)
    assert [_codec(directory, i) for i in range(4)] == ["llvm-so"] * 4
