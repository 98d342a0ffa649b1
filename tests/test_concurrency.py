"""Many processes at once: single-flight builds, killed lock holders, failure cache, stats."""

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
from codegen_cache._storage._locks import KeyLocks
from slow_codegen import SLOW_LLVM
from time_limits import limit
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


@pytest.mark.slow
def test_four_processes_compile_each_cold_key_once(tmp_path):
    log = tmp_path / "calls.log"
    procs = [_spawn(tmp_path / "cache", 0, 5, log) for _ in range(4)]
    results = _finish(procs)
    calls = _calls(log)
    assert sorted(calls) == [f"add_{i}" for i in range(5)]
    assert set(calls.values()) == {1}, calls  # every key compiled exactly once
    assert all(not r["wrong"] for r in results)
    tiers = Counter(t for r in results for t in r["tiers"])
    assert tiers["codegen"] == 5 and tiers["disk"] == 15
    stats = cc.CodegenCache(tmp_path / "cache").stats()
    assert (stats.codegen_runs, stats.hits_disk, stats.misses) == (5, 15, 5)  # one hit or miss per lower


def _locks(directory: Path) -> list[str]:
    """Lock files named by a key (the shared file of byte locks is not one)."""
    names = os.listdir(directory / "locks") if (directory / "locks").is_dir() else []
    return sorted(n for n in names if n != "keys")


def _is_locked(directory: Path, key: str) -> bool:
    probe = KeyLocks(directory / "locks")  # its own open file: excluded like another process
    held = probe.acquire(key, wait=0)
    if held is None:
        return True
    probe.release(held)
    return False


@pytest.mark.slow
def test_killed_lock_holder_lets_the_next_process_build_at_once(tmp_path):
    log = tmp_path / "calls.log"
    holder = _spawn(tmp_path / "cache", 7, 1, log, seconds="60")
    try:
        _wait_ready([holder])
        deadline = time.monotonic() + 60
        while "add_7" not in _calls(log):  # the holder is inside the codegen, holding the lock
            assert time.monotonic() < deadline and holder.poll() is None, holder.stderr.read()[-2000:]
            time.sleep(0.05)
        mod, target = variant(7)
        key = cc.CodegenCache(tmp_path / "cache").key_for(mod, target, codegen=SLOW_LLVM).digest
        assert _is_locked(tmp_path / "cache", key)
        os.kill(holder.pid, signal.SIGKILL)
        holder.communicate()
        start = time.monotonic()
        (result,) = _finish([_spawn(tmp_path / "cache", 7, 1, log, seconds="0.1")])
        assert result["tiers"] == ["codegen"] and not result["wrong"]
        assert result["stats"]["lease_waits"] == 0  # the kernel dropped the dead holder's lock
        assert time.monotonic() - start < 60
        assert not _is_locked(tmp_path / "cache", key)
        assert _locks(tmp_path / "cache") == []  # no lock file is left behind
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate()


def test_a_planted_or_leftover_lock_file_holds_nothing(tmp_path):
    mod, target = variant(12)
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    key = cache.key_for(mod, target, codegen=SLOW_LLVM).digest
    (tmp_path / "cache" / "locks").mkdir(parents=True)
    (tmp_path / "cache" / "locks" / key).write_text('{"host": "h", "pid": 1, "expires": 1e12}')
    start = time.monotonic()
    _module, outcome = cache.lower_with_outcome(mod, target, codegen=SLOW_LLVM)
    assert outcome.tier == "codegen" and time.monotonic() - start < 10
    assert cache.stats(shared=False).lease_waits == 0


@pytest.mark.slow
def test_a_waiter_wakes_within_50ms_of_the_holders_unlock(tmp_path):
    locks = KeyLocks(tmp_path / "locks")
    held = locks.acquire("k" * 32, wait=0)
    assert held is not None and held.fd >= 0
    waiter = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from codegen_cache._storage._locks import KeyLocks\n"
         f"locks = KeyLocks({str(tmp_path / 'locks')!r})\n"
         "print('waiting', flush=True)\n"
         "sys.stdin.readline()\n"  # woken through a pipe first: this run's wake-up latency
         "print(repr(time.time()), flush=True)\n"
         "held = locks.acquire('k' * 32, wait=30)\n"
         "print(repr(time.time()), flush=True)\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with waiter:
        try:
            assert waiter.stdout.readline().strip() == "waiting"
            sent = time.time()
            waiter.stdin.write("go\n")
            waiter.stdin.flush()
            baseline = float(waiter.stdout.readline()) - sent
            time.sleep(0.5)
            released = time.time()
            locks.release(held)
            woke = float(waiter.stdout.readline())
            print(f"waiter woke {1e3 * (woke - released):.1f} ms after the unlock "
                  f"({1e3 * baseline:.1f} ms after a write to its pipe)")
            # 10 ms polls: ~10 ms on an idle machine, plus the wake-up latency of this load; far
            # below a second (a slower poll, or a wait for the lock's holder to exit, is more).
            assert 0 <= woke - released < limit(baseline, at_least=0.4, at_most=0.9, factor=3.0), (woke - released)
        finally:
            waiter.kill()


def test_waiter_builds_anyway_after_bounded_wait(tmp_path, caplog):
    mod, target = variant(11)
    cache = cc.CodegenCache(tmp_path / "cache", lease_wait=0.5, write_behind=False)
    key = cache.key_for(mod, target, codegen=SLOW_LLVM).digest
    # A live holder (this process, through another KeyLocks) that never finishes.
    held = KeyLocks(tmp_path / "cache" / "locks").acquire(key, wait=0)
    assert held is not None and held.fd >= 0
    start = time.monotonic()
    module, outcome = cache.lower_with_outcome(mod, target, codegen=SLOW_LLVM)
    assert outcome.tier == "codegen" and 0.5 <= time.monotonic() - start < 30
    assert "building here" in caplog.text


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
    with pytest.raises(ValueError, match="^invalid config add_3") as info:  # the type the codegen raised
        fresh.lower(mod, target, codegen=SLOW_LLVM)
    assert isinstance(info.value, cc.CachedCodegenError) and info.value.error_type == "ValueError"
    assert _calls(log) == Counter({"add_3": 1})
    assert fresh.stats().failures_served == 1
    # Cleared: the codegen runs again (and now succeeds).
    monkeypatch.delenv("SLOW_CODEGEN_FAIL")
    fresh.clear(compiled=False, source=False, failures=True)
    assert fresh.lower_with_outcome(mod, target, codegen=SLOW_LLVM)[1].tier == "codegen"


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


def _replace_function(mod):
    gv = next(iter(mod.functions))
    mod.update_func(gv, mod[gv].with_attr("mutated", 1))  # changes the caller's module in place


def _add_function(mod):
    gv = next(iter(mod.functions))
    mod["extra"] = mod[gv].with_attr("global_symbol", "extra")


@pytest.mark.parametrize("change", [_replace_function, _add_function])
def test_mutating_codegen_result_is_returned_but_not_stored(tmp_path, caplog, change):
    import tvm

    def mutating(mod, target):
        result = tvm.get_global_func("target.build.llvm")(mod, target)
        change(mod)
        return result

    codegen = cc.DeviceCodegen("mutating", build=mutating)
    mod, target = cc.prepare_for_codegen(__import__("kernels").vadd, "llvm")
    cache = cc.CodegenCache(tmp_path / "cache", write_behind=False)
    module, outcome = cache.lower_with_outcome(mod, target, codegen=codegen)
    assert outcome.tier == "codegen" and outcome.stored is False
    assert module.implements_function("vadd")
    assert len(cache.store("compiled")) == 0
    assert "changed its input IRModule" in caplog.text
    assert cache.stats(shared=False).mutations == 1


def test_outcomes_are_recorded_per_call(cache, llvm_vadd):
    mod, target = llvm_vadd
    with cc.record_outcomes() as outcomes:
        cache.lower(mod, target)
        cache.lower(mod, target)
    assert [o.tier for o in outcomes] == ["codegen", "memory"]
    assert outcomes[0].key == outcomes[1].key == cache.key_for(mod, target).digest
    assert outcomes[0].codegen_seconds > 0 and outcomes[1].load_seconds < outcomes[0].codegen_seconds
    assert outcomes[1].codegen_seconds == outcomes[0].codegen_seconds  # what the hit saved
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


@pytest.mark.slow
def test_stats_from_processes_add_up_and_reset(tmp_path):
    log = tmp_path / "calls.log"
    _finish([_spawn(tmp_path / "cache", 40, 3, log, seconds="0")])
    _finish([_spawn(tmp_path / "cache", 40, 3, log, seconds="0")])
    cache = cc.CodegenCache(tmp_path / "cache")
    stats = cache.stats()
    assert (stats.codegen_runs, stats.hits_disk, stats.misses, stats.stores) == (3, 3, 3, 3)
    assert stats.saved_seconds > 0
    cache.reset_stats()
    assert cache.stats().hits == 0 and cache.stats().codegen_runs == 0


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
mod, target = cc.prepare_for_codegen(kernels.vadd_gpu, {{"kind": "cuda", "arch": "sm_90"}})
print(cc.CodegenCache({cache!r}).precompile_cuda(mod, target))
"""


@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="nvcc is not on PATH")
@pytest.mark.slow
@pytest.mark.nvcc
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
    assert cc.CodegenCache(tmp_path / "cache").stats().codegen_runs == 1  # nvcc ran once for 3 processes


def test_an_entry_promoted_between_the_store_read_and_the_staged_read_is_a_hit(tmp_path):
    """Another process's writer moves a staged entry into its store (store first, staged file
    last) right between this lookup's two reads: the lookup finds it, never builds it again."""
    directory = tmp_path / "cache"
    mod, target = variant(3)
    first = cc.CodegenCache(directory, write_behind=False)
    key = first.lower_with_outcome(mod, target, compile_device=False)[1].key
    blob = first.store("source").get(key)
    first.store("source").delete(key)
    first.staged("source").write(key, blob)  # staged, as a process whose writer has not run yet
    first.close()
    cache = cc.CodegenCache(directory, write_behind=False)
    staged = cache.staged("source")
    read, reads = staged.read, []

    def promoted_meanwhile(digest):
        reads.append(digest)
        if len(reads) == 1:
            return None  # the first lookup: the other process is still building (nothing staged yet)
        # The recheck after the build lock: that process's writer moves the entry right now,
        # the store first, then the staged file goes.
        other = cc.CodegenCache(directory, write_behind=False)
        other.store("source").put(digest, read(digest))
        other.staged("source").remove(digest, read(digest))
        other.close()
        return read(digest)

    staged.read = promoted_meanwhile
    _module, outcome = cache.lower_with_outcome(mod, target, compile_device=False)
    assert outcome.tier == "disk" and len(reads) == 2
    assert cache.stats(shared=False).codegen_runs == 0
    cache.close()
