"""Fresh interpreters for tests: this process's environment with tests/ importable, output captured."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).parent
START_UP_HOOK = Path(sysconfig.get_paths()["purelib"]) / "codegen_cache_enable.pth"


def environ(**extra: str | None) -> dict[str, str]:
    """This process's environment with tests/ on PYTHONPATH and `extra` set (None: removed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    for name, value in extra.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def python(script: str, *args: str, timeout: float = 240, env: dict[str, str | None] | None = None,
           check: bool = True) -> subprocess.CompletedProcess:
    """Run `script` (dedented) in a fresh interpreter; with check, fail naming its stderr when it fails."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=environ(**(env or {})))
    if check and done.returncode != 0:
        raise AssertionError(f"the script exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


def python_json(script: str, *args: str, **kwargs) -> object:
    """python(), then the JSON its last output line holds."""
    return json.loads(python(script, *args, **kwargs).stdout.strip().splitlines()[-1])


def remove_tree(directory: Path, tries: int = 20) -> None:
    """Remove `directory` as a user's `rm -rf` does, run again until it is gone.

    A helper of the cache (the llvm upgrader) may write a file into a subdirectory while the
    removal walks it, and one pass then fails with "Directory not empty": the user runs it again.
    """
    for _ in range(tries):
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.lexists(directory):
            return
        time.sleep(0.05)
    raise AssertionError(f"{directory} is still there after {tries} removals: {sorted(os.listdir(directory))}")


def reap(pid: int, timeout: float) -> int:
    """The exit status of forked child `pid` (waiting up to `timeout`); a child still running then
    (or stopped) is killed and AssertionError raised."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGCONT)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} did not finish within {timeout}s")
