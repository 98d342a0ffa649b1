"""Every lowering leaves an outcome that says what happened: hit, codegen, failure or uncached."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import codegen_cache as cc
import kernels


def _broken(mod, target):
    raise RuntimeError("no registers left")


BROKEN = cc.DeviceCodegen("broken", build=_broken)


def test_no_active_cache_is_uncached_not_the_previous_outcome(cache, llvm_vadd):
    mod, target = llvm_vadd
    codegen = cc.resolve_device_codegen(target)
    with cc.use_cache(cache):
        codegen.lower(mod, target, compile_device=True)
    assert cc.last_outcome().tier == "codegen"
    with cc.use_cache(None):
        codegen.lower(mod, target, compile_device=True)
        outcome = cc.last_outcome()
        assert outcome.tier == "uncached" and outcome.key == "" and not outcome.hit
        assert 0 < outcome.codegen_seconds == outcome.total_seconds
        cc.build(kernels.vadd, "llvm")
        assert cc.last_outcome().tier == "uncached" and cc.last_outcome().codegen == "build"


def test_a_failure_now_and_a_remembered_failure_are_failure_outcomes(cache, llvm_vadd):
    mod, target = llvm_vadd
    cache.lower(mod, target, compile_device=True)
    assert cc.last_outcome().tier == "codegen"
    with pytest.raises(RuntimeError, match="no registers left"):
        cache.lower(mod, target, compile_device=True, codegen=BROKEN)
    now = cc.last_outcome()
    assert (now.tier, now.codegen, now.hit) == ("failure", "broken", False) and now.codegen_seconds > 0
    with pytest.raises(cc.CachedCodegenError):
        cache.lower(mod, target, compile_device=True, codegen=BROKEN)
    served = cc.last_outcome()
    assert (served.tier, served.key, served.codegen_seconds) == ("failure", now.key, 0.0)
    assert cache.stats().failures_served == 1


def test_a_failing_codegen_without_a_cache_is_a_failure_outcome(llvm_vadd):
    mod, target = llvm_vadd
    with cc.use_cache(None), pytest.raises(RuntimeError):
        BROKEN.lower(mod, target, compile_device=True)
    assert cc.last_outcome().tier == "failure" and cc.last_outcome().key == ""


def test_a_build_hit_reports_what_it_saved(cache):
    with cc.use_cache(cache):
        cc.build(kernels.vmul, "llvm")
        cold = cc.last_outcome()
        cc.build(kernels.vmul, "llvm")
        warm = cc.last_outcome()
    assert cold.tier == "codegen" and warm.tier == "memory"
    assert warm.codegen_seconds == pytest.approx(cold.codegen_seconds) and warm.codegen_seconds > 0
    assert warm.total_seconds < cold.total_seconds


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_caching_disabled_is_uncached(tmp_path):
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        import codegen_cache as cc, kernels
        mod, target = cc.prepare_for_codegen(kernels.vadd, "llvm")
        cc.resolve_device_codegen(target).lower(mod, target, compile_device=True)
        print(cc.last_outcome().tier)
        cc.build(kernels.vadd, "llvm")
        print(cc.last_outcome().tier)
    """) % os.path.dirname(kernels.__file__)
    env = {**os.environ, "CODEGEN_CACHE_DIR": str(tmp_path / "cache"), "CODEGEN_CACHE_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=200)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["uncached", "uncached"]
    assert not (tmp_path / "cache").exists()


def test_disable_turns_off_an_explicit_cache_too(monkeypatch, tmp_path, llvm_vadd):
    monkeypatch.setenv("CODEGEN_CACHE_DISABLE", "1")
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    mod, target = llvm_vadd
    with cc.record_outcomes() as outcomes, cc.use_cache(cache):
        for _ in range(2):
            cache.lower(mod, target, compile_device=True)
            cc.build(kernels.vadd, "llvm")
    assert [o.tier for o in outcomes] == ["uncached"] * 4
    assert all(o.codegen_seconds > 0 for o in outcomes)
    assert cache.stats().codegen_runs == 0 and cache.stats().stores == 0
    cache.close()


def test_an_outcome_is_recorded_by_named_fields_only():
    from codegen_cache import _outcome

    with pytest.raises(TypeError, match="positional"):
        _outcome.emit("memory", "0" * 32, "cuda", "source", 0.0, 0.0, 0.0, 0.0)  # type: ignore[misc]
    _outcome.emit(tier="disk", key="1" * 32, codegen="cuda", mode="source", key_seconds=1e-5, load_seconds=2e-4,
                  codegen_seconds=1e-3, total_seconds=3e-4)
    outcome = cc.last_outcome()
    assert (outcome.tier, outcome.key, outcome.load_seconds, outcome.total_seconds, outcome.stored) == (
        "disk", "1" * 32, 2e-4, 3e-4, None)


def test_fetch_reads_a_store_and_fetch_kept_only_this_processs_memory(tmp_path, llvm_vadd):
    mod, target = llvm_vadd
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    _module, outcome = cache.lower_with_outcome(mod, target, compile_device=True)
    cache.close()
    fresh = cc.CodegenCache(tmp_path / "cache")  # an empty memory tier, the same directory
    with pytest.raises(ValueError, match="unknown mode None"):
        fresh.fetch(outcome.key, None)  # type: ignore[arg-type]
    assert fresh.fetch_kept(outcome.key, ir=mod) is None  # on disk, not kept in this process
    module, meta = fresh.fetch(outcome.key, "compiled", ir=mod)
    assert module.kind == _module.kind and meta["key"] == outcome.key
    fresh.keep("2" * 32, module, mod, {"note": "kept"})
    kept, kept_meta = fresh.fetch_kept("2" * 32, ir=mod)
    assert kept is module and kept_meta == {"note": "kept"}
    fresh.close()
