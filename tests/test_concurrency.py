"""Many processes at once: single-flight builds, killed lease holders, failure cache, stats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import codegen_cache as cc
from codegen_cache._storage._leases import LeaseManager
from codegen_cache._storage._disk import ArtifactStore
from slow_codegen import SLOW_LLVM
from variants import variant

WORKER = str(Path(__file__).parent / "flight_worker.py")


def _spawn(directory, first, count, log, *extra, seconds="0.3", fail=None):
    env = {**os.environ, "SLOW_CODEGEN_LOG": str(log), "SLOW_CODEGEN_SECONDS": seconds}
    if fail:
        env["SLOW_CODEGEN_FAIL"] = fail
    return subprocess.Popen([sys.executable, WORKER, str(directory), str(first), str(count), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_ready(procs):
    for p in procs:
        line = p.stdout.readline()
        assert json.loads(line) == {"ready": True}, p.stderr.read()[-2000:]


def _finish(procs, timeout=240):
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def _calls(log: Path) -> Counter:
    return Counter(line.split()[1] for line in log.read_text().splitlines()) if log.exists() else Counter()


def test_four_processes_compile_each_cold_key_once(tmp_path):
    log = tmp_path / "calls.log"
    procs = [_spawn(tmp_path / "cache", 0, 5, log) for _ in range(4)]
    results = _finish(procs)
    calls = _calls(log)
    assert sorted(calls) == [f"add_{i}" for i in range(5)]
    assert set(calls.values()) == {1}, calls  # every key compiled exactly once
    assert all(not r["wrong"] for r in results)
    tiers = Counter(t for r in results for t in r["tiers"])
    assert tiers["built"] == 5 and tiers["disk"] == 15
    stats = cc.CodegenCache(tmp_path / "cache").stats()
    assert (stats.builds, stats.hits_disk, stats.misses) == (5, 15, 5)  # one hit or miss per lower


def test_killed_lease_holder_is_taken_over(tmp_path):
    log = tmp_path / "calls.log"
    holder = _spawn(tmp_path / "cache", 7, 1, log, seconds="60")
    try:
        _wait_ready([holder])
        deadline = time.monotonic() + 60
        while "add_7" not in _calls(log):  # the holder is inside the codegen, holding the lease
            assert time.monotonic() < deadline and holder.poll() is None, holder.stderr.read()[-2000:]
            time.sleep(0.05)
        leases = ArtifactStore(tmp_path / "cache" / "leases", size_limit=1 << 20)
        assert len(list(leases.keys())) == 1
        os.kill(holder.pid, signal.SIGKILL)
        holder.communicate()
        start = time.monotonic()
        (result,) = _finish([_spawn(tmp_path / "cache", 7, 1, log, seconds="0.1")])
        assert result["tiers"] == ["built"] and not result["wrong"]
        assert time.monotonic() - start < 60  # not the 600 s lease wait
        assert list(leases.keys()) == []  # no lease left behind
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate()


def test_lease_of_a_dead_owner_elsewhere_expires(tmp_path):
    store = ArtifactStore(tmp_path / "leases", size_limit=1 << 20)
    owner = json.dumps({"host": "another-host", "pid": 1, "tid": 1, "t": 0}).encode()
    store.add("k", owner, expire=0.5)  # a holder on another host that stopped renewing
    leases = LeaseManager(store, timeout=5)
    assert leases.is_held_elsewhere("k") and not leases.try_acquire("k")
    time.sleep(0.7)
    assert leases.try_acquire("k")
    leases.release("k")
    assert store.get("k") is None


def test_waiter_builds_anyway_after_bounded_wait(tmp_path, caplog):
    store = ArtifactStore(tmp_path / "cache" / "leases", size_limit=1 << 20)
    mod, target = variant(11)
    cache = cc.CodegenCache(tmp_path / "cache", lease_wait=0.5, write_behind=False)
    key = cache.key_for(mod, target, codegen=SLOW_LLVM).digest
    # A live holder (this process, another thread id) that never finishes.
    store.add(key, json.dumps({"host": "another-host", "pid": os.getpid(), "tid": 0, "t": 0}).encode(), expire=60)
    start = time.monotonic()
    module, outcome = cache.lower_with_outcome(mod, target, codegen=SLOW_LLVM)
    assert outcome.tier == "built" and 0.5 <= time.monotonic() - start < 30
    assert "waited 0s for another process" in caplog.text or "building here" in caplog.text


def test_failure_is_cached_and_raised_again_without_recompiling(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("SLOW_CODEGEN_LOG", str(log))
    monkeypatch.setenv("SLOW_CODEGEN_SECONDS", "0")
    monkeypatch.setenv("SLOW_CODEGEN_FAIL", "add_3")
    mod, target = variant(3)
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    with pytest.raises(ValueError, match="invalid config add_3"):
        cache.lower(mod, target, codegen=SLOW_LLVM)
    fresh = cc.CodegenCache(tmp_path / "cache")  # another process would see the same
    with pytest.raises(cc.CachedCodegenError, match="ValueError: invalid config add_3") as info:
        fresh.lower(mod, target, codegen=SLOW_LLVM)
    assert isinstance(info.value, RuntimeError) and info.value.error_type == "ValueError"
    assert _calls(log) == Counter({"add_3": 1})
    assert fresh.stats().failures_served == 1
    # Cleared: the codegen runs again (and now succeeds).
    monkeypatch.delenv("SLOW_CODEGEN_FAIL")
    fresh.clear(compiled=False, source=False, failures=True)
    assert fresh.lower_with_outcome(mod, target, codegen=SLOW_LLVM)[1].tier == "built"


def test_failure_cache_expires_after_ttl(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOW_CODEGEN_SECONDS", "0")
    monkeypatch.setenv("SLOW_CODEGEN_FAIL", "add_4")
    mod, target = variant(4)
    cache = cc.CodegenCache(tmp_path / "cache", failure_ttl=0.3, write_behind=False)
    with pytest.raises(ValueError):
        cache.lower(mod, target, codegen=SLOW_LLVM)
    with pytest.raises(cc.CachedCodegenError):
        cache.lower(mod, target, codegen=SLOW_LLVM)
    time.sleep(0.5)
    with pytest.raises(ValueError, match="invalid config add_4"):
        cache.lower(mod, target, codegen=SLOW_LLVM)


def test_failure_key_includes_toolchain(tmp_path, cuda_vadd, monkeypatch):
    calls = []

    def failing(mod, target):
        calls.append(1)
        raise RuntimeError("ptxas rejected it")

    codegen = cc.DeviceCodegen("cuda", build=failing, toolchain=SLOW_LLVM.toolchain or (
        lambda t, c: {"opts": os.environ.get("TVM_CUDA_PTXAS_EXTRA_OPTS", "")}))
    mod, target = cuda_vadd
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    monkeypatch.setenv("TVM_CUDA_PTXAS_EXTRA_OPTS", "-O1")
    with pytest.raises(RuntimeError, match="ptxas rejected it"):
        cache.lower(mod, target, codegen=codegen)
    with pytest.raises(cc.CachedCodegenError):
        cache.lower(mod, target, codegen=codegen)
    monkeypatch.setenv("TVM_CUDA_PTXAS_EXTRA_OPTS", "-O3")  # a new toolchain: tried again
    with pytest.raises(RuntimeError, match="ptxas rejected it"):
        cache.lower(mod, target, codegen=codegen)
    assert len(calls) == 2


def test_mutating_codegen_result_is_returned_but_not_stored(tmp_path, caplog):
    import tvm

    def mutating(mod, target):
        result = tvm.get_global_func("target.build.llvm")(mod, target)
        gv = next(iter(mod.functions))
        mod.update_func(gv, mod[gv].with_attr("mutated", 1))  # changes the caller's module in place
        return result

    codegen = cc.DeviceCodegen("mutating", build=mutating)
    mod, target = cc.lower_for_codegen(__import__("kernels").vadd, "llvm")
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    module, outcome = cache.lower_with_outcome(mod, target, codegen=codegen)
    assert outcome.tier == "built" and outcome.stored is False
    assert module.implements_function("vadd")
    assert len(cache.store("compiled")) == 0
    assert "changed its input IRModule" in caplog.text
    assert cache.stats(shared=False).mutations == 1


def test_outcomes_are_recorded_per_call(cache, llvm_vadd):
    mod, target = llvm_vadd
    with cc.record_outcomes() as outcomes:
        cache.lower(mod, target)
        cache.lower(mod, target)
    assert [o.tier for o in outcomes] == ["built", "memory"]
    assert outcomes[0].key == outcomes[1].key == cache.key_for(mod, target).digest
    assert outcomes[0].build_seconds > 0 and outcomes[1].load_seconds < outcomes[0].build_seconds
    assert outcomes[1].build_seconds == outcomes[0].build_seconds  # what the hit saved
    assert cc.last_outcome() == outcomes[1]


def test_memory_tier_is_bounded_by_count(tmp_path):
    cache = cc.CodegenCache(tmp_path / "cache", memory_entries=2, write_behind=False)
    inputs = [variant(i) for i in range(20, 23)]
    for mod, target in inputs:
        cache.lower(mod, target)
    assert len(cache._memory) == 2
    assert cache.lower_with_outcome(*inputs[0])[1].tier == "disk"  # evicted from memory
    assert cache.lower_with_outcome(*inputs[2])[1].tier == "memory"


def test_memory_tier_is_bounded_by_bytes(tmp_path):
    cache = cc.CodegenCache(tmp_path / "cache", memory_bytes=1, write_behind=False)
    mod, target = variant(30)
    cache.lower(mod, target)
    assert len(cache._memory) == 0
    assert cache.lower_with_outcome(mod, target)[1].tier == "disk"


def test_stats_from_processes_add_up_and_reset(tmp_path):
    log = tmp_path / "calls.log"
    _finish([_spawn(tmp_path / "cache", 40, 3, log, seconds="0")])
    _finish([_spawn(tmp_path / "cache", 40, 3, log, seconds="0")])
    cache = cc.CodegenCache(tmp_path / "cache")
    stats = cache.stats()
    assert (stats.builds, stats.hits_disk, stats.misses, stats.stores) == (3, 3, 3, 3)
    assert stats.saved_seconds > 0
    cache.reset_stats()
    assert cache.stats().hits == 0 and cache.stats().builds == 0


def test_evictions_are_counted(tmp_path):
    cache = cc.CodegenCache(tmp_path / "cache", memory_entries=1, source_size_limit=200_000, write_behind=False)
    for i in range(50, 58):
        mod, target = variant(i)
        cache.lower(mod, target, compile_device=False)  # LLVM IR text, about 10 KB each
    stats = cache.stats(shared=False)
    assert stats.evictions_memory == 7
    assert stats.evictions >= 1 and len(cache.store("source")) < 8


PRECOMPILE = """
import sys
sys.path.insert(0, {tests!r})
import codegen_cache as cc, kernels
mod, target = cc.lower_for_codegen(kernels.vadd_gpu, {{"kind": "cuda", "arch": "sm_90"}})
print(cc.CodegenCache({cache!r}).precompile_cuda(mod, target))
"""


@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="nvcc is not on PATH")
def test_precompile_cuda_is_single_flight(tmp_path):
    script = PRECOMPILE.format(tests=str(Path(__file__).parent), cache=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    keys = set()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        keys.add(out.strip().splitlines()[-1])
    assert len(keys) == 1
    assert cc.CodegenCache(tmp_path / "cache").stats().builds == 1  # nvcc ran once for 3 processes
