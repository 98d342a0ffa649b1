"""Only a live build makes others wait: a lock holder that is stopped is passed over like a dead one.

A process compiling a key holds its build lock; stopped with SIGSTOP (Ctrl-Z, a debugger, a
paused container) it keeps it. The others must get their module within STOPPED_GRACE seconds
and a few looks, not after lease_wait; a waiter names whom it waits for; a live holder (asleep
in its codegen) is still waited for. Continued later, the stopped process finishes its build
and stores it, and every module served runs correctly.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tvm

import codegen_cache as cc
from codegen_cache._storage._locks import STOPPED_GRACE, KeyLocks
from processes import reap
from slow_codegen import SLOW_LLVM
from variants import variant

WORKER = str(Path(__file__).parent / "flight_worker.py")
LEASE_WAIT = 60.0  # a waiter that does not pass over the holder fails at this bound, not at 600 s
SLACK = 3.0  # the looks (4 a second) and a loaded machine, on top of STOPPED_GRACE


def _runs(module, i: int) -> bool:
    a = np.arange(256, dtype="float32")
    out = tvm.runtime.tensor(np.zeros(256, "float32"))
    module[f"add_{i}"](tvm.runtime.tensor(a), out)
    return bool(np.array_equal(out.numpy(), a + i))


def _wait_for_call(log: Path, name: str, alive, timeout: float = 120) -> None:
    """Until the slow codegen logged its call of `name`: its caller is inside the build, holding the lock."""
    deadline = time.monotonic() + timeout
    while not (log.exists() and name in log.read_text()):
        assert time.monotonic() < deadline and alive(), f"no call of {name} logged"
        time.sleep(0.02)


def _is_locked(directory: Path, key: str) -> bool:
    probe = KeyLocks(directory / "locks")  # an open file of its own: excluded like another process
    held = probe.acquire(key, wait=0)
    if held is None:
        return True
    probe.release(held)
    return False


def _fork_holder(directory: Path, log: Path, i: int, seconds: float) -> int:
    """A forked child that lowers variant `i` with the slow codegen; exits 0 when its module runs correctly."""
    mod, target = variant(i)
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            os.environ.update(SLOW_CODEGEN_LOG=str(log), SLOW_CODEGEN_SECONDS=str(seconds))
            cache = cc.CodegenCache(directory, write_behind=False)
            module, outcome = cache.lower_with_outcome(mod, target, codegen=SLOW_LLVM)
            code = 0 if outcome.tier == "codegen" and _runs(module, i) else 1
            cache.close()
        finally:
            os._exit(code)
    return pid


@pytest.mark.parametrize("stopped", [True, False], ids=["stopped-holder-passed-over", "sleeping-holder-waited-for"])
def test_a_waiter_passes_over_a_stopped_holder_and_waits_for_a_live_one(tmp_path, monkeypatch, caplog, stopped):
    directory, log, i = tmp_path / "cache", tmp_path / "calls.log", 31
    mod, target = variant(i)
    holds = STOPPED_GRACE + 2.5  # the holder's codegen outlasts the grace: a waiter must not wait it out
    pid = _fork_holder(directory, log, i, holds)
    reaped = False
    try:
        _wait_for_call(log, f"add_{i}", lambda: os.waitpid(pid, os.WNOHANG) == (0, 0))
        if stopped:
            os.kill(pid, signal.SIGSTOP)
        monkeypatch.setenv("SLOW_CODEGEN_SECONDS", "0.1")
        monkeypatch.delenv("SLOW_CODEGEN_LOG", raising=False)
        cache = cc.CodegenCache(directory, write_behind=False, lease_wait=LEASE_WAIT)
        start = time.monotonic()
        with caplog.at_level(logging.INFO, logger="codegen_cache"):
            module, outcome = cache.lower_with_outcome(mod, target, codegen=SLOW_LLVM)
        took = time.monotonic() - start
        assert _runs(module, i)
        said = [r.getMessage() for r in caplog.records]
        assert any(f"waiting for process {pid} on " in m and "since" in m for m in said), said
        if stopped:
            # Passed over after the grace, well before the holder's build or lease_wait would end.
            assert outcome.tier == "codegen" and STOPPED_GRACE <= took < STOPPED_GRACE + SLACK, took
            assert any(f"process {pid} on " in m and "stopped" in m for m in said), said
            os.kill(pid, signal.SIGCONT)
        else:
            assert outcome.tier == "disk" and took >= holds - 1.0, took  # the live build was waited for
            assert not any("stopped" in m for m in said), said
        reaped = True
        assert reap(pid, 120) == 0  # continued, the holder finished its build and its module ran
    finally:
        if not reaped:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass  # it exited (and was reaped) before the test got that far
    key = cache.key_for(mod, target, codegen=SLOW_LLVM).digest
    assert not _is_locked(directory, key)
    again, outcome = cc.CodegenCache(directory).lower_with_outcome(mod, target, codegen=SLOW_LLVM)
    assert outcome.tier == "disk" and _runs(again, i)
    assert _calls(log) == 1  # the holder's one codegen call (the waiter's, when it built, is not logged)


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines())


@pytest.mark.slow
def test_a_process_stopped_while_compiling_does_not_hold_up_a_fresh_one(tmp_path):
    """Fresh interpreters (flight_worker.py): the holder is stopped inside its build; another gets its module."""
    directory, log, i = tmp_path / "cache", tmp_path / "calls.log", 33
    env = {**os.environ, "SLOW_CODEGEN_LOG": str(log), "SLOW_CODEGEN_SECONDS": "20"}
    holder = subprocess.Popen([sys.executable, WORKER, str(directory), str(i), "1"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    waiter = None
    try:
        _wait_for_call(log, f"add_{i}", lambda: holder.poll() is None, timeout=240)
        holder.send_signal(signal.SIGSTOP)
        waiter = subprocess.Popen([sys.executable, WORKER, str(directory), str(i), "1", "--lease-wait", str(LEASE_WAIT)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**env, "SLOW_CODEGEN_SECONDS": "0.1", "SLOW_CODEGEN_LOG": ""})
        out, err = waiter.communicate(timeout=240)
        assert waiter.returncode == 0, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        # "wall" is the lowering alone (after the interpreter and TVM started).
        assert result["tiers"] == ["codegen"] and not result["wrong"] and result["wall"] < STOPPED_GRACE + SLACK, result
        assert f"process {holder.pid} on " in err and "stopped" in err, err[-3000:]  # WARNING reaches stderr
        holder.send_signal(signal.SIGCONT)
        out, err = holder.communicate(timeout=240)
        assert holder.returncode == 0, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        assert result["tiers"] == ["codegen"] and not result["wrong"], result  # its build, stored or skipped cleanly
    finally:
        for proc in (holder, waiter):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.communicate()
    mod, target = variant(i)
    module, outcome = cc.CodegenCache(directory).lower_with_outcome(mod, target, codegen=SLOW_LLVM)
    assert outcome.tier == "disk" and _runs(module, i)
