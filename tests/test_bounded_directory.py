"""A cache directory's size is bounded by its entries: a fleet of short processes that only hit leaves nothing behind.

Each process counts into a file of its own in `<dir>/stats/`; the counts must reach the
directory's totals, exactly once, without anyone reading the stats: a process that exits folds
its own file, and the files of processes that ended without exit handlers (fork pool workers,
os._exit) are folded by the next process that counts there.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

import codegen_cache as cc
import forked
from codegen_cache._cache._upgrade import wait_exited
import processes

HIT = textwrap.dedent("""
    import json, sys
    import codegen_cache as cc, kernels
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    cache = cc.CodegenCache(sys.argv[1])
    print(json.dumps({"tier": cache.lower_with_outcome(mod, target)[1].tier}))
""")
FILL = HIT + "assert cache.flush(upgrades=True, timeout=200)\n"


def _files(directory: Path) -> dict[str, int]:
    """Every file under `directory` (relative path -> bytes)."""
    found = {}
    for root, _dirs, names in os.walk(directory):
        for name in names:
            path = Path(root, name)
            found[str(path.relative_to(directory))] = path.stat().st_size
    return found


def _counter_files(directory: Path) -> list[str]:
    return sorted(p for p in _files(directory) if p.startswith("stats/"))


def _forked_tier(directory: Path, script: str) -> str:
    done = forked.python(["-c", script, str(directory)], env=processes.environ(), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["tier"]


@pytest.mark.timeout(600)
def test_a_fleet_of_processes_that_end_without_exit_handlers_leaves_one_counter_file(tmp_path):
    directory = tmp_path / "cache"
    assert _forked_tier(directory, FILL) == "codegen"
    sizes = []
    runs = 6
    for _ in range(runs):
        assert _forked_tier(directory, HIT) == "disk"
        # The child before this one ended like a pool worker (no atexit): this one's writer folded its file.
        assert len(_counter_files(directory)) <= 2, _counter_files(directory)  # this one's, the upgrader's
        sizes.append(_files(directory))
    files_after_two = {p for p in sizes[1] if not p.startswith("stats/")}
    files_at_end = {p for p in sizes[-1] if not p.startswith("stats/")}
    assert files_at_end <= files_after_two  # nothing accumulates (a database's -wal may go)
    assert sum(sizes[-1].values()) <= sum(sizes[1].values()) + 64 * 1024
    stats = cc.CodegenCache(directory).stats()
    assert (stats.hits_disk, stats.misses) == (runs, 1)  # every process's counts, each once


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_process_that_exits_folds_its_counts_and_leaves_no_counter_file(tmp_path):
    directory = tmp_path / "cache"
    for expected in ("codegen", "disk", "disk"):
        result = processes.python_json(FILL if expected == "codegen" else HIT, str(directory))
        assert result["tier"] == expected
        # The upgrader folds its own file as it exits, just after it lets its lock go.
        assert wait_exited(directory, 60)
        deadline = time.monotonic() + 30
        while _counter_files(directory) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _counter_files(directory) == []
    stats = cc.CodegenCache(directory).stats()
    assert (stats.hits_disk, stats.misses, stats.upgrades) == (2, 1, 1)


def test_a_counter_file_is_never_folded_between_its_creation_and_its_lock(tmp_path, monkeypatch):
    # Another process's scan takes the lock of any counter file it can: one whose owner has not
    # locked it yet would be folded (empty), recorded as folded and removed, and every count of
    # its owner lost. Here that scan runs in that window: the owner's own lock waits for it.
    import fcntl

    from codegen_cache._storage import _counters

    owner, scanner = (_counters.CounterTable(tmp_path) for _ in range(2))
    scanner.add("scanner")
    lock, scanned = fcntl.flock, []

    def flock_after_a_scan(fd, flags):
        if not scanned:  # the owner's lock, the first one asked for: the scan (whose locks pass) first
            scanned.append("scanning")
            scanner.totals()
        return lock(fd, flags)

    monkeypatch.setattr(_counters.fcntl, "flock", flock_after_a_scan)
    owner.add("hits", 3)
    monkeypatch.setattr(_counters.fcntl, "flock", lock)
    assert scanned and scanner.totals().get("hits") == 3.0
    owner.fold_own()
    assert scanner.totals().get("hits") == 3.0 and len(os.listdir(tmp_path / "stats")) == 1  # the scanner's


def test_a_counter_file_left_before_its_lock_is_removed_once_an_hour_old(tmp_path):
    from codegen_cache._storage import _counters

    table = _counters.CounterTable(tmp_path)
    table.add("hits")
    old, new = (tmp_path / "stats" / f"cgc-host-{pid}-0123abcd.cnt.new" for pid in (1, 2))
    for leftover in (old, new):
        leftover.write_bytes(bytes(64))
    os.utime(old, (time.time() - 7200,) * 2)
    table.totals()
    assert not old.exists() and new.exists()  # the young one may be a process's about to lock it
