"""Every call through the cache is counted once, in one row, as its outcome says.

A Relax compile (tvm.compile under the switch), a TIR build (codegen_cache.build and
tvm.tirx.build under the switch) and a kernel lowering (CodegenCache.lower) are each taken cold,
warm in memory, warm from disk (a second CodegenCache object on the same directory) and, for the
model, after a weight edit. After each call: one hit (of the tier last_outcome() names, saving
its codegen seconds once) or one miss, in the row named by the outcome's codegen and mode; the
counters' totals are the sums of their rows, and `codegen-cache stats -v` shows the same.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import CUDA_TARGET
from tvm.target import Target

import codegen_cache as cc
import kernels
import relax_models
from codegen_cache._cli import _main as _cli

HIT_TIERS = ("memory", "disk", "remote")
ROW_COUNTS = ("hits", "misses", "codegen_runs", "stores", "uncacheable", "uncached_cheap", "memory_only")


def _check_call(cache: cc.CodegenCache, call, tier: str, row: str):
    """Run `call`; check its outcome is `tier` in `row` and the counters moved by exactly that one call."""
    before = cache.stats()
    result = call()
    outcome = cc.last_outcome()
    after = cache.stats()
    assert (outcome.tier, f"{outcome.codegen}/{outcome.mode}") == (tier, row), outcome
    moved = {n: getattr(after, n) - getattr(before, n) for n in ("hits_memory", "hits_disk", "hits_remote", "misses")}
    saved = after.saved_seconds - before.saved_seconds
    if outcome.hit:
        assert moved == {**dict.fromkeys(moved, 0), f"hits_{tier}": 1}, moved
        assert outcome.codegen_seconds > 0 and saved == pytest.approx(outcome.codegen_seconds, rel=1e-6, abs=1e-9)
    else:
        assert moved == {**dict.fromkeys(moved, 0), "misses": 1}, moved
        assert saved == 0
    # The call's one count is in its own row; no other row counted a hit or a miss.
    for pair in set(before.by_codegen) | set(after.by_codegen):
        old, new = before.by_codegen.get(pair, {}), after.by_codegen.get(pair, {})
        hits, misses = (new.get(n, 0) - old.get(n, 0) for n in ("hits", "misses"))
        expected = ((1, 0) if outcome.hit else (0, 1)) if pair == row else (0, 0)
        assert (hits, misses) == expected, (pair, old, new)
    _check_totals(after)
    return result, outcome, after


def _check_totals(stats: cc.CacheStats) -> None:
    rows = stats.by_codegen.values()
    for name in ROW_COUNTS:
        assert sum(row[name] for row in rows) == getattr(stats, name), name
    for name in ("codegen_seconds", "saved_seconds"):
        assert sum(row[name] for row in rows) == pytest.approx(getattr(stats, name), rel=1e-9, abs=1e-9), name


def _stats_verbose(capsys, directory) -> tuple[dict[str, str], dict[str, list[str]]]:
    """`codegen-cache stats -v` in this process: its summary lines by first word, its table rows by name."""
    code = _cli.main(["--dir", str(directory), "stats", "-v"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("CODEGEN"))
    table = {}
    for line in lines[header + 1:]:
        cells = line.split()
        if cells:
            # CODEGEN MODE HITS MISSES RUNS STORES UNCACHEABLE TIME unit SAVED unit ("total" has no mode)
            name = cells[0] if cells[0] == "total" else f"{cells[0]}/{cells[1]}"
            table[name] = cells[1:] if cells[0] == "total" else cells[2:]
    summary = {line.split()[0]: line for line in lines[:header] if line.strip()}
    return summary, table


def _check_report(capsys, directory, stats: cc.CacheStats) -> None:
    """stats -v: the summary's hits, misses and time saved are its total row, the sum of the rows above it."""
    summary, table = _stats_verbose(capsys, directory)
    total = table.pop("total")
    assert set(table) == set(stats.by_codegen)
    for column, name in enumerate(("hits", "misses", "codegen_runs", "stores")):
        assert int(total[column]) == sum(int(row[column]) for row in table.values()) == getattr(stats, name), name
    assert summary["hits"].split()[1] == total[0] and summary["misses"].split()[1] == total[1]
    saved = " ".join(total[-2:])
    assert summary["time"].split()[2:4] == saved.split(), (summary["time"], saved)


# ---- a Relax model through tvm.compile --------------------------------------------------------


def _model(weight: float) -> tvm.IRModule:
    return relax_models.with_constant(np.full((4, 8), weight, "float32"))


def _result(executable, weight: float) -> None:
    x = relax_models.inputs((4, 8))
    np.testing.assert_allclose(relax_models.run(executable, "main", x), x * weight + 1, rtol=1e-6)


def test_a_relax_compile_counts_one_hit_or_one_miss_in_its_row(capsys, tmp_path):
    directory, row = tmp_path / "cache", "relax.build/model"
    first = cc.CodegenCache(directory, write_behind=False)
    cc.enable(first, children=False)
    try:
        cold, outcome, stats = _check_call(first, lambda: tvm.compile(_model(2.0), "llvm"), "codegen", row)
        _result(cold, 2.0)
        assert outcome.codegen_seconds > 0 and stats.codegen_runs >= 1  # its codegen ran, counted in its own row
        assert stats.by_codegen["llvm/compiled"]["codegen_runs"] == stats.codegen_runs
        _result(_check_call(first, lambda: tvm.compile(_model(2.0), "llvm"), "memory", row)[0], 2.0)
        second = cc.CodegenCache(directory, write_behind=False)  # another object: nothing in memory
        cc.enable(second, children=False)
        _result(_check_call(second, lambda: tvm.compile(_model(2.0), "llvm"), "disk", row)[0], 2.0)
        # A weight edit: another model key (a miss, the Relax pipeline runs), while its TIR build
        # is served from the index: no codegen runs and no hit is counted for this compile.
        runs = second.stats().codegen_runs
        edited, outcome, stats = _check_call(second, lambda: tvm.compile(_model(3.0), "llvm"), "codegen", row)
        _result(edited, 3.0)
        assert stats.codegen_runs == runs and outcome.codegen_seconds == 0 and outcome.stored
        _result(_check_call(second, lambda: tvm.compile(_model(3.0), "llvm"), "memory", row)[0], 3.0)
        # tvm.tirx.build under the switch is a TIR build: one count in the build row.
        _check_call(second, lambda: tvm.tirx.build(kernels.vmul, "llvm"), "codegen", "build/build")
        _check_call(second, lambda: tvm.tirx.build(kernels.vmul, "llvm"), "memory", "build/build")
    finally:
        cc.disable()
    _check_report(capsys, directory, second.stats())


# ---- a TIR build through codegen_cache.build --------------------------------------------------


@pytest.mark.parametrize("kernel, target", [(kernels.vadd, "llvm"), (kernels.vadd_gpu, CUDA_TARGET)],
                         ids=["llvm", "cuda-host-and-device"])
def test_a_tir_build_counts_one_hit_or_one_miss_however_many_codegen_results_it_holds(capsys, tmp_path, kernel,
                                                                                      target):
    directory, row = tmp_path / "cache", "build/build"
    target = Target(target)
    first = cc.CodegenCache(directory, write_behind=False)
    with cc.use_cache(first):
        _check_call(first, lambda: cc.build(kernel, target), "codegen", row)
        _check_call(first, lambda: cc.build(kernel, target), "memory", row)
    second = cc.CodegenCache(directory, write_behind=False)
    with cc.use_cache(second):
        _check_call(second, lambda: cc.build(kernel, target), "disk", row)
        _check_call(second, lambda: cc.build(kernel, target), "memory", row)
    parts = 2 if "cuda" in str(target) else 1
    stats = second.stats()
    assert (stats.hits, stats.misses, stats.codegen_runs, stats.stores) == (3, 1, parts, parts)
    _check_report(capsys, directory, stats)


# ---- a kernel through CodegenCache.lower ------------------------------------------------------


def test_a_kernel_lowering_counts_one_hit_or_one_miss_in_its_codegen_row(capsys, tmp_path):
    directory = tmp_path / "cache"
    mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
    first = cc.CodegenCache(directory, write_behind=False)
    _check_call(first, lambda: first.lower(mod, target), "codegen", "llvm/compiled")
    _check_call(first, lambda: first.lower(mod, target), "memory", "llvm/compiled")
    second = cc.CodegenCache(directory, write_behind=False)
    _check_call(second, lambda: second.lower(mod, target), "disk", "llvm/compiled")
    _check_report(capsys, directory, second.stats())
