"""One meaning per word: a codegen run is a `codegen` run, preparing a kernel is `prepare`, the
whole-build index is `index`; nothing has been released, so no other spelling is answered."""

from __future__ import annotations

import pytest

import codegen_cache as cc


def test_a_codegen_run_is_counted_and_reported_under_codegen_names(tmp_path, llvm_vadd):
    from codegen_cache._outcome import TIERS

    cache = cc.CodegenCache(tmp_path / "c", write_behind=False)
    _module, outcome = cache.lower_with_outcome(*llvm_vadd, compile_device=True)
    assert outcome.tier == "codegen" and outcome.codegen_seconds > 0 and "built" not in TIERS
    stats = cache.stats()
    assert (stats.codegen_runs, stats.misses) == (1, 1) and stats.codegen_seconds > 0
    assert stats.by_codegen["llvm/compiled"]["codegen_runs"] == 1
    data = stats.as_dict()
    assert data["codegen_runs"] == 1 and "builds" not in data and "build_seconds" not in data
    assert "builds" not in data["by_codegen"]["llvm/compiled"]
    cache.reset_stats()
    assert (cache.stats().codegen_runs, cache.stats().codegen_seconds) == (0, 0.0)


@pytest.mark.parametrize("old", ["lower_kernel", "lower_for_codegen", "LoweredKernel", "LoweringError"])
def test_only_the_prepare_names_exist(old):
    with pytest.raises(AttributeError):
        getattr(cc, old)
    assert {"prepare_kernel", "prepare_for_codegen", "PreparedKernel", "PrepareError"} <= set(cc.__all__)


def test_min_codegen_time_has_one_name(tmp_path):
    assert cc.settings_from_env({"CODEGEN_CACHE_MIN_CODEGEN_TIME": "0.002"}).min_codegen_time == 0.002
    from codegen_cache._config import unknown_env_vars

    assert unknown_env_vars({"CODEGEN_CACHE_MIN_BUILD_TIME": "0"}) == ["CODEGEN_CACHE_MIN_BUILD_TIME"]
    with pytest.raises(TypeError):
        cc.CodegenCache(tmp_path / "c", min_build_time=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        cc.Settings(min_build_time=1)  # type: ignore[call-arg]


def test_the_index_store_has_one_name(tmp_path):
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False)
    assert cache.store("index") is cache.store("index")
    for name in ("builds", "pending"):
        with pytest.raises(ValueError, match=f"unknown store '{name}'"):
            cache.store(name)
    with pytest.raises(TypeError):
        cache.clear(builds=True)  # type: ignore[call-arg]
