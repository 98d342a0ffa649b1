"""Names renamed by issue 26 (one meaning per word): the new name is what is produced, and each
old one keeps working until the next release (docs/cli.md, "Renamed in this release")."""

from __future__ import annotations

import json
import sqlite3

import pytest

import codegen_cache as cc
from codegen_cache._cli import _main as _cli


def _old_counts(directory, counts):
    """Counts in <dir>/stats.sqlite under the names an earlier release folded them with."""
    directory.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(directory / "stats.sqlite") as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value REAL NOT NULL)")
        conn.executemany("INSERT INTO counters(name, value) VALUES (?, ?)", list(counts.items()))


def test_a_codegen_run_is_counted_as_codegen_runs_and_the_old_counter_names_warn(tmp_path, llvm_vadd):
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False)
    cache.lower(*llvm_vadd, compile_device=True)
    stats = cache.stats()
    assert (stats.codegen_runs, stats.misses) == (1, 1) and stats.codegen_seconds > 0
    assert stats.by_codegen["llvm/compiled"]["codegen_runs"] == 1
    with pytest.warns(DeprecationWarning, match="CacheStats.codegen_runs"):
        assert stats.builds == 1
    with pytest.warns(DeprecationWarning, match="CacheStats.codegen_seconds"):
        assert stats.build_seconds == stats.codegen_seconds


def test_counts_written_under_the_old_names_are_folded_into_the_new_ones_once(tmp_path, llvm_vadd):
    directory = tmp_path / "c"
    _old_counts(directory, {"builds": 2, "build_seconds": 0.5, "by:llvm:compiled:builds": 2,
                            "by:llvm:compiled:build_seconds": 0.5, "misses": 2})
    cache = cc.CodegenCache(directory, write_behind=False)
    cache.lower(*llvm_vadd, compile_device=True)
    stats = cache.stats()
    assert (stats.codegen_runs, stats.misses) == (3, 3) and stats.codegen_seconds > 0.5
    row = stats.by_codegen["llvm/compiled"]
    assert row["codegen_runs"] == 3 and row["codegen_seconds"] > 0.5 and "builds" not in row
    data = stats.as_dict()
    assert (data["codegen_runs"], data["builds"]) == (3, 3)  # the old key, until the next release
    assert data["by_codegen"]["llvm/compiled"]["builds"] == 3
    assert data["build_seconds"] == data["codegen_seconds"] == stats.codegen_seconds
    cache.reset_stats()
    assert (cache.stats().codegen_runs, cache.stats().codegen_seconds) == (0, 0.0)  # old counts zeroed too


def test_stats_prints_codegen_runs_and_its_json_keeps_the_old_keys(tmp_path, llvm_vadd, capsys):
    directory = tmp_path / "c"
    _old_counts(directory, {"builds": 4, "build_seconds": 1.0})
    assert _cli.main(["--dir", str(directory), "stats"]) == 0
    assert "codegen runs       4   codegen time" in capsys.readouterr().out
    assert _cli.main(["--dir", str(directory), "stats", "--json"]) == 0
    counters = json.loads(capsys.readouterr().out)["counters"]
    assert (counters["codegen_runs"], counters["builds"], counters["codegen_seconds"]) == (4, 4, 1.0)


def test_an_outcome_has_codegen_seconds_and_its_old_name_warns(tmp_path, llvm_vadd):
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False)
    _module, outcome = cache.lower_with_outcome(*llvm_vadd, compile_device=True)
    assert outcome.codegen_seconds > 0
    with pytest.warns(DeprecationWarning, match="Outcome.codegen_seconds"):
        assert outcome.build_seconds == outcome.codegen_seconds


def test_the_codegen_tier_is_named_codegen(tmp_path, llvm_vadd):
    from codegen_cache._outcome import TIERS

    cache = cc.CodegenCache(tmp_path / "c", write_behind=False)
    assert cache.lower_with_outcome(*llvm_vadd, compile_device=True)[1].tier == "codegen"
    assert "codegen" in TIERS and "built" not in TIERS


@pytest.mark.parametrize(("old", "new"), [("lower_kernel", "prepare_kernel"), ("lower_for_codegen", "prepare_for_codegen"),
                                          ("LoweredKernel", "PreparedKernel"), ("LoweringError", "PrepareError")])
def test_the_old_names_of_preparing_a_kernel_warn_and_are_the_new_ones(old, new):
    with pytest.warns(DeprecationWarning, match=f"codegen_cache.{old} is now codegen_cache.{new}"):
        assert getattr(cc, old) is getattr(cc, new)
    assert old not in cc.__all__ and new in cc.__all__


def test_lower_for_codegen_still_prepares_a_kernel():
    import kernels

    with pytest.warns(DeprecationWarning, match="prepare_for_codegen"):
        mod, target = cc.lower_for_codegen(kernels.vadd, "llvm")
    assert target.kind.name == "llvm" and [g.name_hint for g in mod.functions] == ["vadd"]
    with pytest.raises(AttributeError, match="no attribute 'lower_nothing'"):
        cc.lower_nothing  # noqa: B018


def test_min_codegen_time_is_read_from_its_variable_and_from_its_old_name():
    assert cc.settings_from_env({"CODEGEN_CACHE_MIN_CODEGEN_TIME": "0.002"}).min_codegen_time == 0.002
    assert cc.settings_from_env({"CODEGEN_CACHE_MIN_BUILD_TIME": "0.002"}).min_codegen_time == 0.002
    both = {"CODEGEN_CACHE_MIN_CODEGEN_TIME": "0.0020", "CODEGEN_CACHE_MIN_BUILD_TIME": "0.002"}
    assert cc.settings_from_env(both).min_codegen_time == 0.002  # the same value twice
    with pytest.raises(cc.ConfigError, match=r"'0'.*CODEGEN_CACHE_MIN_CODEGEN_TIME.*CODEGEN_CACHE_MIN_BUILD_TIME"):
        cc.settings_from_env({"CODEGEN_CACHE_MIN_CODEGEN_TIME": "0", "CODEGEN_CACHE_MIN_BUILD_TIME": "auto"})
    with pytest.raises(cc.ConfigError, match="CODEGEN_CACHE_MIN_BUILD_TIME: expected auto, or seconds"):
        cc.settings_from_env({"CODEGEN_CACHE_MIN_BUILD_TIME": "fast"})
    from codegen_cache._config import describe_settings, unknown_env_vars

    assert unknown_env_vars({"CODEGEN_CACHE_MIN_BUILD_TIME": "0"}) == []  # not reported as a typo
    row = next(r for r in describe_settings({"CODEGEN_CACHE_MIN_BUILD_TIME": "1"}) if r.field == "min_codegen_time")
    assert (row.variable, row.value, row.origin) == ("CODEGEN_CACHE_MIN_CODEGEN_TIME", 1.0, "environment")


def test_the_old_min_build_time_variable_reaches_a_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("CODEGEN_CACHE_MIN_CODEGEN_TIME")  # set by conftest for the suite
    monkeypatch.setenv("CODEGEN_CACHE_MIN_BUILD_TIME", "3600")
    assert cc.CodegenCache(tmp_path / "c").settings.min_codegen_time == 3600.0


def test_the_min_build_time_keyword_warns_and_sets_min_codegen_time(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"CodegenCache\(min_build_time=...\) is now min_codegen_time"):
        cache = cc.CodegenCache(tmp_path / "c", min_build_time=3600)
    assert cache.settings.min_codegen_time == 3600.0
    with pytest.raises(TypeError, match="both min_codegen_time and its old name min_build_time"):
        cc.CodegenCache(tmp_path / "c", min_codegen_time=0, min_build_time=0)
    with pytest.warns(DeprecationWarning, match="'min_build_time' is now 'min_codegen_time'"):
        settings = cc.Settings(min_build_time=0.5)
    assert settings.min_codegen_time == 0.5
    with pytest.warns(DeprecationWarning, match="Settings.min_build_time is now Settings.min_codegen_time"):
        assert settings.min_build_time == 0.5
    with pytest.warns(DeprecationWarning, match="settings_from_env"):
        assert cc.settings_from_env({}, min_build_time="auto").min_codegen_time == "auto"


def _old_layout(directory):
    """A cache directory as the release before issue 26's renames left it: entries in every
    store, one of them still staged, the index under builds/ and the staged files under pending/."""
    import kernels

    cache = cc.CodegenCache(directory, write_behind=False)
    outcome = cache.lower_with_outcome(*cc.prepare_for_codegen(kernels.vadd, "llvm"), compile_device=False)[1]
    staged = cache.lower_with_outcome(*cc.prepare_for_codegen(kernels.vmul, "llvm"), compile_device=False)[1]
    blob = cache.store("source").get(staged.key)
    cache.store("source").delete(staged.key)
    cache.staged("source").write(staged.key, blob)  # as a process that ended before its writer moved it
    with cc.use_cache(cache):
        cc.build(kernels.vadd, "c")
    cache.close()
    (directory / "staged" / "index").mkdir(parents=True, exist_ok=True)
    (directory / "staged" / "index").rename(directory / "staged" / "builds")
    (directory / "staged").rename(directory / "pending")
    (directory / "index").rename(directory / "builds")
    return outcome.key, staged.key


def test_a_directory_with_the_old_store_names_is_moved_at_first_use_and_serves_its_entries(tmp_path, capsys):
    import kernels

    directory = tmp_path / "c"
    stored, staged = _old_layout(directory)
    cache = cc.CodegenCache(directory, write_behind=False)  # moves them at its first use of a store
    tiers = [cache.lower_with_outcome(*cc.prepare_for_codegen(k, "llvm"), compile_device=False)[1]
             for k in (kernels.vadd, kernels.vmul)]
    assert not (directory / "builds").exists() and not (directory / "pending").exists()
    assert (directory / "index" / "cache.db").is_file() and (directory / "staged" / "index").is_dir()
    assert [(o.tier, o.key) for o in tiers] == [("disk", stored), ("disk", staged)]  # the staged one too
    with cc.use_cache(cc.CodegenCache(directory, memory_entries=0)), cc.record_outcomes() as outcomes:
        cc.build(kernels.vadd, "c")
    assert [(o.codegen, o.tier) for o in outcomes] == [("build", "disk")]  # served whole from index/
    assert _cli.main(["--dir", str(directory), "stats", "--json"]) == 0
    stores = json.loads(capsys.readouterr().out)["stores"]
    assert stores["index"]["entries"] == 1 and "builds" not in stores
    assert _cli.main(["--dir", str(directory), "verify"]) == 0


def test_old_store_directories_that_cannot_be_moved_miss_and_clear_removes_them(tmp_path):
    import kernels

    directory = tmp_path / "c"
    _stored, staged = _old_layout(directory)
    (directory / "index").mkdir()  # the new names taken already (a process of this release came first)
    (directory / "staged").mkdir()
    cache = cc.CodegenCache(directory, write_behind=False)
    assert (directory / "builds").is_dir() and (directory / "pending").is_dir()  # left, never replaced
    outcome = cache.lower_with_outcome(*cc.prepare_for_codegen(kernels.vmul, "llvm"), compile_device=False)[1]
    assert (outcome.tier, outcome.key) == ("codegen", staged)  # its staged file under pending/ misses once
    with cc.use_cache(cache), cc.record_outcomes() as outcomes:
        cc.build(kernels.vadd, "c")
    assert ("build", "disk") not in [(o.codegen, o.tier) for o in outcomes]  # its index under builds/ misses
    assert cache.clear() > 0
    assert not (directory / "builds").exists() and not (directory / "pending").exists()


def test_the_old_store_name_builds_is_the_index_store_with_a_warning(tmp_path):
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False)
    with pytest.warns(DeprecationWarning, match="store 'builds' is now 'index'"):
        assert cache.store("builds") is cache.store("index")
    with pytest.warns(DeprecationWarning, match="store 'builds' is now 'index'"):
        assert cache.staged("builds") is cache.staged("index")
    with pytest.warns(DeprecationWarning, match=r"clear\(builds=...\) is now clear\(index=...\)"):
        assert cache.clear(builds=True) == 0
    with pytest.raises(ValueError, match="unknown store 'pending'"):
        cache.store("pending")
