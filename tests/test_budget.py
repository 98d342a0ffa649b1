"""A minimum codegen time per tier (as JAX's min_compile_time): an entry goes to disk and remote
only when its codegen runs MIN_CODEGEN_SECONDS or more, and no key is computed where the key alone
breaks the miss budget."""

from __future__ import annotations

import dataclasses
import time

import pytest

import codegen_cache as cc
from codegen_cache._cache import _cache as cache_module
from codegen_cache._cache._budget import (
    EVERY_TIER,
    LEARN_RUNS,
    MIN_CODEGEN_SECONDS,
    NO_TIER,
    WINDOW,
    TierBudget,
    miss_budget,
    no_slower_budget,
)
from codegen_cache._cache._cache import store_in_every_tier
from codegen_cache._compat import tvm

# ---- the decision, from measurements fed in (no clock involved) ------------------------------


def _fed(runs, key_share=0.0, *, min_codegen_time="auto"):
    budget = TierBudget(min_codegen_time)
    for seconds in runs:
        budget.ran("cg", "source", seconds, key_share * seconds)
    return budget


def _tiers(plan):
    return (plan.memory, plan.disk, plan.remote)


def test_every_tier_is_used_until_a_codegen_has_run_three_times():
    budget = _fed([1e-6] * (LEARN_RUNS - 1), key_share=10.0)
    assert budget.plan("cg", "source") is EVERY_TIER
    assert budget.plan("never-seen", "source") is EVERY_TIER
    budget.ran("cg", "source", 1e-6, 1e-5)
    assert budget.plan("cg", "source").keyed is False


def test_a_codegen_cheaper_than_its_key_uses_no_tier():
    plan = _fed([20e-6] * 5, key_share=1.0).plan("cg", "source")
    assert plan == NO_TIER._replace(why=plan.why) and "no tier pays" in plan.why


def test_a_key_that_breaks_the_miss_budget_uses_no_tier():
    # 10 ms runs with a 5 ms key: memory hits would save 5 ms, but every miss would cost 50%.
    plan = _fed([10e-3] * 5, key_share=0.5).plan("cg", "source")
    assert not plan.keyed and "budget" in plan.why
    # A C-like 5.5 ms run with a 1.6 ms key: over the 0.55 ms budget, whatever a hit would save.
    assert not _fed([5.5e-3] * 5, key_share=0.3).plan("cg", "source").keyed


def test_a_codegen_under_the_minimum_is_kept_in_memory_only():
    plan = _fed([2e-3] * 5, key_share=0.01).plan("cg", "source")  # a 2 ms source codegen, a 20 us key
    assert _tiers(plan) == (True, False, False) and "under min_codegen_time" in plan.why
    assert _tiers(_fed([0.9 * MIN_CODEGEN_SECONDS] * 5, key_share=0.01).plan("cg", "source")) == (True, False, False)


def test_a_codegen_at_the_minimum_uses_every_tier():
    assert _fed([MIN_CODEGEN_SECONDS] * 5, key_share=0.01).plan("cg", "source") is EVERY_TIER
    # llvm: a 14.6 ms vector add with a key of a few microseconds.
    assert _fed([14.6e-3] * 5, key_share=1e-3).plan("cg", "source") is EVERY_TIER


def test_a_slow_codegen_uses_every_tier():
    # nvcc: 0.4 s runs against a key of microseconds.
    assert _fed([0.4] * WINDOW, key_share=1e-4).plan("cg", "source") == EVERY_TIER


def test_one_slow_call_changes_no_decision():
    cheap = _fed([10e-6] * 5, key_share=1.0)
    cheap.ran("cg", "source", 2.0, None)  # preempted once
    assert not cheap.plan("cg", "source").keyed
    slow = _fed([0.4] * 5, key_share=1e-4)
    slow.ran("cg", "source", 1e-6, 1e-6)
    assert slow.plan("cg", "source") == EVERY_TIER


def test_an_even_number_of_runs_is_decided_by_the_mean_of_the_middle_two():
    low = MIN_CODEGEN_SECONDS
    # (0.8 + 1.16) / 2 = 0.98 of the minimum: memory only, where the upper middle run alone is over it.
    below = _fed([0.8 * low, 0.8 * low, 1.16 * low, 1.2 * low], key_share=0.01).plan("cg", "source")
    assert _tiers(below) == (True, False, False)
    # (0.84 + 1.2) / 2 = 1.02: every tier, where the lower middle run alone is under it.
    assert _fed([0.8 * low, 0.84 * low, 1.2 * low, 1.2 * low], key_share=0.01).plan("cg", "source") is EVERY_TIER


def test_the_decision_follows_the_runs_when_they_change():
    budget = _fed([8e-6] * WINDOW, key_share=0.05)  # under a memory hit's fixed cost
    assert not budget.plan("cg", "source").keyed
    for _ in range(WINDOW // 2 + 1):
        budget.ran("cg", "source", 0.1, None)  # uncached runs are timed too: bigger kernels now
    assert budget.plan("cg", "source").keyed


def test_min_codegen_time_seconds_replace_the_minimum_and_zero_stores_everything():
    plan = _fed([1e-3] * 5, min_codegen_time=0.01).plan("cg", "source")
    assert _tiers(plan) == (True, False, False) and "min_codegen_time" in plan.why
    assert _fed([0.1] * 5, min_codegen_time=0.01).plan("cg", "source") == EVERY_TIER
    assert _fed([1e-3] * 5, min_codegen_time=1e-4).plan("cg", "source") == EVERY_TIER  # under the default
    assert _fed([1e-6] * 5, key_share=10.0, min_codegen_time=0.0).plan("cg", "source") is EVERY_TIER


def test_miss_budget_is_ten_percent_or_point_three_ms():
    assert miss_budget(1e-3) == 0.3e-3 and miss_budget(0.1) == pytest.approx(0.01)


def test_a_cheap_codegen_whose_key_and_memory_tier_break_ten_percent_runs_without_a_key():
    # A source-only CUDA vector add: a 0.25 ms codegen, a key of 15 us. Kept in memory, each new
    # kernel would cost the key and the memory tier's miss on top: more than max(10%, 20 us).
    assert no_slower_budget(0.25e-3) == pytest.approx(25e-6) and no_slower_budget(1e-4) == 20e-6
    plan = _fed([0.25e-3] * 5, key_share=0.06).plan("cg", "source")
    assert not plan.keyed and "no tier pays" in plan.why
    # A 1 ms codegen with the same key: its memory-only misses fit 10%.
    assert _tiers(_fed([1e-3] * 5, key_share=0.015).plan("cg", "source")) == (True, False, False)


def test_the_first_calls_one_time_costs_do_not_decide():
    # The first key pays the toolchain salts.
    budget = TierBudget("auto")
    budget.ran("cg", "source", 10e-3, 5e-3)
    for _ in range(3):
        budget.ran("cg", "source", 10e-3, 50e-6)
    assert budget.plan("cg", "source").disk


# ---- through CodegenCache: a real codegen, a real directory --------------------------------


def _constant_codegen(name="cheap"):
    """A codegen that returns a module made beforehand: cheaper than any key."""
    made = tvm.get_global_func("runtime.SourceModuleCreate")("// cheap", "cu")
    return cc.DeviceCodegen(name, build=lambda mod, target: made, build_without_compile=lambda mod, target: made)


def _timed_codegen(inner, seconds=0.005):
    """`inner`'s source-only codegen, made to run far longer than its key (memory pays for it)."""

    def run(mod, target):
        time.sleep(seconds)
        return inner.build_without_compile(mod, target)

    return cc.DeviceCodegen(inner.name, build=run, build_without_compile=run)


def _salted(codegen, i):
    return dataclasses.replace(codegen, salt=f"kernel-{i}")  # the same codegen, a fresh key


def test_where_no_tier_pays_the_codegen_runs_uncached_without_a_key(tmp_path, cuda_vadd, monkeypatch):
    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time="auto")
    codegen = _constant_codegen()
    for i in range(LEARN_RUNS):
        assert cache.lower_with_outcome(mod, target, compile_device=False, codegen=_salted(codegen, i))[1].tier \
            == "codegen"
    hashed = []
    real_hash = cache_module.ir_hash
    monkeypatch.setattr(cache_module, "ir_hash", lambda m: hashed.append(m) or real_hash(m))
    module, outcome = cache.lower_with_outcome(mod, target, compile_device=False, codegen=_salted(codegen, 99))
    assert (outcome.tier, outcome.key, outcome.stored) == ("uncached", "", False)
    assert module.inspect_source() == "// cheap" and hashed == []
    stats = cache.stats()
    assert (stats.uncached_cheap, stats.misses, stats.codegen_runs, stats.stores) == (1, LEARN_RUNS, LEARN_RUNS,
                                                                                LEARN_RUNS)
    assert stats.by_codegen["cheap/source"]["uncached_cheap"] == 1
    assert cache.stats().uncacheable == 0  # a cheap call is not an input the key cannot hold
    cache.close()


def test_a_missing_mode_still_raises_the_seed_error_when_uncached(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time="auto")
    made = tvm.get_global_func("runtime.SourceModuleCreate")("// cheap", "cu")
    codegen = cc.DeviceCodegen("source-only", build_without_compile=lambda mod, target: made)
    for i in range(LEARN_RUNS + 1):
        cache.lower(mod, target, compile_device=False, codegen=_salted(codegen, i))
    assert cc.last_outcome().tier == "uncached"
    with pytest.raises(ValueError, match="source-only.*with compilation"):
        cache.lower(mod, target, compile_device=True, codegen=codegen)
    cache.close()


def test_memory_only_entries_are_hits_here_and_never_reach_the_disk(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time=3600)  # every run is shorter
    codegen = _timed_codegen(cc.resolve_device_codegen(target))
    for i in range(LEARN_RUNS):
        cache.lower(mod, target, compile_device=False, codegen=_salted(codegen, i))
    later = _salted(codegen, "later")
    built, outcome = cache.lower_with_outcome(mod, target, compile_device=False, codegen=later)
    assert outcome.tier == "codegen" and outcome.stored is False
    again, hit = cache.lower_with_outcome(mod, target, compile_device=False, codegen=later)
    assert hit.tier == "memory" and again.same_as(built) and hit.key == outcome.key
    assert cache.store("source").get(outcome.key) is None and cache.staged("source").read(outcome.key) is None
    fresh = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time=0)  # another process
    assert fresh.lower_with_outcome(mod, target, compile_device=False, codegen=later)[1].tier == "codegen"
    stats = cache.stats(shared=False)
    assert (stats.misses, stats.codegen_runs, stats.stores, stats.memory_only) == (LEARN_RUNS + 1, LEARN_RUNS + 1,
                                                                             LEARN_RUNS, 1)
    cache.close()
    fresh.close()


def test_a_codegen_slower_than_any_hit_keeps_storing_on_disk(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time="auto")
    inner = cc.resolve_device_codegen(target)

    def slow(m, t):
        time.sleep(0.02)  # a compile: far more than a key, a disk hit or a remote hit
        return inner.build_without_compile(m, t)

    codegen = cc.DeviceCodegen("slow", build=slow, build_without_compile=slow)
    keys = [cache.lower_with_outcome(mod, target, compile_device=False, codegen=_salted(codegen, i))[1].key
            for i in range(LEARN_RUNS + 3)]
    assert all(cache.store("source").get(key) is not None for key in keys)
    assert cache.stats().stores == len(keys) and cache.stats().uncached_cheap == 0
    cache.close()


def test_a_whole_build_stores_every_part_however_cheap(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time="auto")
    codegen = _constant_codegen()
    for i in range(LEARN_RUNS):
        cache.lower(mod, target, compile_device=False, codegen=_salted(codegen, i))
    cache.lower(mod, target, compile_device=False, codegen=_salted(codegen, "cheap-now"))
    assert cc.last_outcome().tier == "uncached"
    with store_in_every_tier():
        _module, outcome = cache.lower_with_outcome(mod, target, compile_device=False,
                                                    codegen=_salted(codegen, "in-a-build"))
    assert outcome.tier == "codegen" and outcome.stored and cache.store("source").get(outcome.key) is not None
    cache.close()


def test_min_codegen_time_is_a_setting_with_its_variable():
    assert cc.settings_from_env({}).min_codegen_time == "auto"
    assert cc.settings_from_env({"CODEGEN_CACHE_MIN_CODEGEN_TIME": "0.002"}).min_codegen_time == 0.002
    assert cc.settings_from_env({"CODEGEN_CACHE_MIN_CODEGEN_TIME": " AUTO "}).min_codegen_time == "auto"
    with pytest.raises(cc.ConfigError, match="CODEGEN_CACHE_MIN_CODEGEN_TIME.*auto, or seconds"):
        cc.settings_from_env({"CODEGEN_CACHE_MIN_CODEGEN_TIME": "fast"})
    with pytest.raises(cc.ConfigError, match="min_codegen_time"):
        cc.CodegenCache(min_codegen_time=-1)


def test_a_new_cache_on_the_directory_starts_from_what_the_last_one_learnt(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    first = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time="auto")
    codegen = _constant_codegen()
    for i in range(LEARN_RUNS + 1):
        first.lower(mod, target, compile_device=False, codegen=_salted(codegen, i))
    assert cc.last_outcome().tier == "uncached"
    first.close()  # the background writer has written tiers.json
    assert (tmp_path / "c" / "tiers.json").is_file()
    second = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time="auto")  # a new process
    _module, outcome = second.lower_with_outcome(mod, target, compile_device=False, codegen=_salted(codegen, "new"))
    assert outcome.tier == "uncached" and second.stats(shared=False).codegen_runs == 0
    second.close()


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 99, "codegens": {}}', b'[1, 2]',
                                     b'{"version": 2, "codegens": {"cheap/source": {"codegen_seconds": ["x", -1, 1e300]}}}',
                                     b'{"version": 1, "codegens": {"cheap/source": {"builds": [1e-06, 1e-06, 1e-06]}}}'])
def test_a_damaged_tiers_file_is_ignored(tmp_path, cuda_vadd, content):
    mod, target = cuda_vadd
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "tiers.json").write_bytes(content)
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time="auto")
    assert cache.lower_with_outcome(mod, target, compile_device=False, codegen=_constant_codegen())[1].tier == "codegen"
    cache.close()


def test_a_link_at_the_tiers_file_is_neither_read_nor_written_through(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    elsewhere = tmp_path / "elsewhere.json"
    learnt = b'{"version": 2, "codegens": {"cheap/source": {"codegen_seconds": [1e-06, 1e-06, 1e-06], "key_share": [50]}}}'
    elsewhere.write_bytes(learnt)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "tiers.json").symlink_to(elsewhere)
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time="auto")
    codegen = _constant_codegen()
    assert cache.lower_with_outcome(mod, target, compile_device=False, codegen=codegen)[1].tier == "codegen"
    for i in range(LEARN_RUNS + 1):
        cache.lower(mod, target, compile_device=False, codegen=_salted(codegen, i))
    cache.close()
    assert elsewhere.read_bytes() == learnt  # the file outside the cache is untouched


def test_threads_lowering_at_once_get_modules_and_a_plan(tmp_path, cuda_vadd):
    import threading

    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path / "c", min_codegen_time="auto")
    codegen = _constant_codegen()
    errors, tiers = [], []

    def lower(worker):
        try:
            for i in range(40):
                module, outcome = cache.lower_with_outcome(mod, target, compile_device=False,
                                                           codegen=_salted(codegen, f"{worker}-{i}"))
                assert module.inspect_source() == "// cheap"
                tiers.append(outcome.tier)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=lower, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(tiers) == 160 and "uncached" in tiers
    cache.close()


def test_a_memory_only_codegen_fails_as_itself_every_time_and_writes_no_failure(tmp_path, cuda_vadd):
    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path / "c", write_behind=False, min_codegen_time=3600)
    inner = cc.resolve_device_codegen(target)
    broken = {"now": False}

    def flaky(m, t):
        time.sleep(0.005)  # far longer than its key: memory pays
        if broken["now"]:
            raise ValueError("no registers left")
        return inner.build_without_compile(m, t)

    codegen = cc.DeviceCodegen("flaky", build=flaky, build_without_compile=flaky)
    for i in range(LEARN_RUNS):
        cache.lower(mod, target, compile_device=False, codegen=_salted(codegen, i))
    broken["now"] = True
    for _ in range(2):
        with pytest.raises(ValueError, match="no registers left") as raised:
            cache.lower(mod, target, compile_device=False, codegen=_salted(codegen, "bad"))
        assert not isinstance(raised.value, cc.CachedCodegenError)
    assert cache.stats().failures_stored == 0 and cache.stats().failures_served == 0
    cache.close()
