"""Contention: processes lowering, evicting and re-lowering the same keys at once.

Each of 4 spawned processes runs a random mix of lowers (compiled and source) and evictions
(disk entry deleted, memory tier dropped) on 50 keys, and checks every module it gets against
the codegen's own output. The full count (4 x 500) runs with --stress.
"""

from __future__ import annotations

import pytest

import codegen_cache as cc
from test_reliability import finish, spawn  # noqa: F401  (spawn is a fixture)

PROCESSES, KEYS = 4, 50


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("ops", [pytest.param(40, id="4x40"), pytest.param(500, id="4x500", marks=pytest.mark.stress)])
@pytest.mark.slow
def test_processes_mixing_lowers_and_evictions_get_correct_modules_and_stats_add_up(tmp_path, spawn, ops):  # noqa: F811
    directory, sync = tmp_path / "cache", tmp_path / "sync"
    sync.mkdir()
    procs = [spawn("mixer", dir=str(directory), sync=str(sync), seed=seed, keys=KEYS, ops=ops, workers=PROCESSES)
             for seed in range(PROCESSES)]
    results = [finish(proc, timeout=1400) for proc in procs]
    for result in results:
        assert (result["errors"], result["wrong"]) == (0, 0), result["first_error"]
        assert result["cache_errors"] == {}
        assert result["hits"] + result["misses"] == result["lowers"]  # each lower is one or the other
    shared = cc.CodegenCache(directory).stats()
    lowers = sum(r["lowers"] for r in results)
    assert lowers >= PROCESSES * ops * 0.7
    assert shared.hits + shared.misses == lowers
    assert shared.hits == sum(r["hits"] for r in results)
    assert shared.codegen_runs == sum(r["codegen_runs"] for r in results) <= shared.misses
    assert shared.stores <= shared.codegen_runs and shared.stores_skipped == 0
    assert (shared.corrupt, shared.collisions, shared.errors) == (0, 0, {})
