"""The store path under real process lifecycles: exits, fork, pools, signals, stuck workers.

Every test uses real processes (spawned interpreters, fork, multiprocessing pools), real
signals and real files; a hang fails the test by its timeout. Docs: docs/reliability.md.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from codegen_cache._cache import _upgrade

HERE = Path(__file__).parent


def _python(script: str, *args: str, timeout: float = 120, env: dict | None = None, **kwargs):
    """Run `script` in a fresh interpreter (tests/ on the path); the CompletedProcess."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=environ, **kwargs)


# ---- the llvm upgrader: one per directory ------------------------------------------------------


def _upgraders(directory: Path) -> dict[int, bool]:
    """{pid: whether it has TVM loaded} of the upgrader processes (and launchers) of `directory`."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"_upgrade import main" not in b" ".join(argv) or str(directory).encode() not in argv:
                continue
            with open(f"/proc/{pid}/maps", "rb") as f:
                found[int(pid)] = b"libtvm" in f.read()
        except OSError:
            continue  # gone meanwhile
    return found


@pytest.mark.timeout(240)
def test_many_processes_asking_for_upgrades_at_once_start_one_upgrader(tmp_path):
    directory, go = tmp_path / "cache", tmp_path / "go"
    script = tmp_path / "ask.py"  # a file, so that these processes' command lines do not look like an upgrader's
    script.write_text(textwrap.dedent("""
        import os, sys, time
        from pathlib import Path
        from codegen_cache._cache import _upgrade
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.002)
        print(_upgrade.request(Path(sys.argv[1]), "compiled", "%032x" % int(sys.argv[3])))
    """))
    asks = [subprocess.Popen([sys.executable, str(script), str(directory), str(go), str(i)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(6)]
    try:
        time.sleep(0.5)
        go.touch()
        seen: dict[int, bool] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for pid, tvm_loaded in _upgraders(directory).items():
                seen[pid] = seen.get(pid, False) or tvm_loaded
            if all(p.poll() is not None for p in asks) and not _upgraders(directory) and seen:
                break
            time.sleep(0.02)
        for p in asks:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0 and out.strip() == "True", err[-2000:]
    finally:
        for p in asks:
            if p.poll() is None:
                p.kill()
                p.wait()
    # Launchers exit before they import anything; only the one upgrader loads TVM.
    assert sum(seen.values()) == 1, seen
    assert not os.listdir(directory / "upgrade") or os.listdir(directory / "upgrade") == [".lock"]


def test_waiting_for_upgrades_starts_an_upgrader_at_most_once_a_second(tmp_path, monkeypatch):
    directory, log = tmp_path / "cache", tmp_path / "launches"
    fake = tmp_path / "python"  # an interpreter that never starts an upgrader
    fake.write_text(f"#!/bin/sh\necho launched >> {log}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    (directory / "upgrade").mkdir(parents=True)
    (directory / "upgrade" / ("compiled." + "0" * 32)).touch()
    monkeypatch.setattr(sys, "executable", str(fake))
    start = time.monotonic()
    assert _upgrade.wait_idle(directory, 2.5) is False
    assert 2.5 <= time.monotonic() - start < 5
    launches = len(log.read_text().splitlines())
    assert 1 <= launches <= 3, launches
